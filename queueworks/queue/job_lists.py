"""A queue's jobs listed by state, a page at a time, and one job in full, planned once
(``queueworks.transport.plans``) for ``Queue``/``AsyncQueue`` and the dashboard.

Each state is read through its own index or a bounded range, never a scan of Redis:

============  ======================================================================
state         read from
============  ======================================================================
queued        the stream, after its group's last delivered entry (XRANGE with COUNT),
              then each aside stream (jobs set aside, by handler) likewise, then the
              jobs waiting for a group slot (each group's wait list, by name); total:
              each stream's length less its pending entries, plus the jobs the
              ``groups:waiting`` hash counts
running       the group's pending list (XPENDING with COUNT), oldest read first, then each
              aside stream's likewise
scheduled     the ``scheduled`` zset, by when each runs
deferred      the ``deferred`` zset, by when each was enqueued
done          the ``done`` list (``settle_jobs.lua`` keeps the newest ``DONE_KEPT``),
              newest first
dead          the dead-letter stream, newest first (entries that were no job left out)
cancelled     the ``cancelled`` list (``cancel_job.lua`` keeps the newest ``DONE_KEPT``),
              newest first
============  ======================================================================

``plan_job_counts`` reads each state's ``total`` as its list does, in one or two round
trips: a state's count and its list's total are one number.

A stream is read from the end nearer the page (queued, dead): the last page of a long
list costs what the first does. Each job listed is then read from its record (one pipeline of
HGETALLs), or its entry for a job to run now that has none yet.

``plan_find_jobs`` pages through one state's list, ``SEARCHED`` jobs at most, and keeps
the jobs whose id starts with a text, or whose handler or error has it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from queueworks.protocol.job_options import JobOptions
from queueworks.protocol.jobrecords import (
    DEAD_ATTEMPTS,
    DEAD_ERROR,
    DEAD_HANDLER,
    DEAD_JOB,
    DEAD_PAYLOAD,
    DEAD_REASON,
    DEAD_TS,
    ENTRY_OPTIONS,
    ENTRY_PAYLOAD,
    JOB_ATTEMPTS,
    JOB_ENTRY,
    JOB_ERROR,
    JOB_FINISHED,
    JOB_HANDLER,
    JOB_ID,
    JOB_OPTIONS,
    JOB_PAYLOAD,
    JOB_REASON,
    JOB_RESULT,
    JOB_STATE,
    JOB_TRACE,
    STATUS_FIELDS,
    decode_dead_letter,
    entry_job,
    has_state,
    job_status,
    status_record,
)
from queueworks.protocol.keys import PARKED, Keys, TaskKeys, check_task_id
from queueworks.protocol.messages import text
from queueworks.protocol.models import JobDetail, JobPage, JobState, JobStatus
from queueworks.protocol.priorities import bands_of
from queueworks.queue.aside_jobs import aside_handlers, plan_aside_counts
from queueworks.queue.flow import group_counts, wait_item
from queueworks.queue.queue_plans import plan_job_status_of
from queueworks.queue.queues import ENTRY_ID, running_entries, running_record, running_rows
from queueworks.transport.plans import Plan, Trip

LISTED = (
    JobState.QUEUED,
    JobState.SCHEDULED,
    JobState.DEFERRED,
    JobState.RUNNING,
    JobState.DONE,
    JobState.DEAD,
    JobState.CANCELLED,
)
MAX_LIMIT = 1000  # jobs on one page at most
SEARCHED = 10_000  # jobs of a state a text search looks through at most
SEARCH_BATCH = 500  # jobs a text search reads a round trip
DEAD_LOOKED = 200  # the newest dead letters a job page looks in for a dead job's payload
WAIT_LOOKED = 1000  # the oldest jobs of a wait list a job page looks in for a waiting one's

Listed = tuple[int, list[JobStatus]]


def check_page(state: str, limit: int, offset: int) -> JobState:
    """The state to list, checked with the page: ``ValueError`` naming what is wrong."""
    try:
        listed = JobState(state)
    except ValueError:
        listed = None
    if listed not in LISTED:
        raise ValueError(f"state must be one of {', '.join(LISTED)}, not {state!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be an integer from 1 to {MAX_LIMIT}, not {limit!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an integer of 0 or more, not {offset!r}")
    return listed


def plan_jobs(keys: Keys, name: str, state: str, limit: int = 20, offset: int = 0) -> Plan[JobPage]:
    """The page of queue ``name``'s jobs in ``state`` (one of ``LISTED``): ``limit`` of them
    after ``offset``, and how many there are. Two to four round trips."""
    qk = keys.task(check_task_id(name, "queue name"))
    listed = check_page(state, limit, offset)
    read = {
        JobState.QUEUED: _queued,
        JobState.RUNNING: _running,
        JobState.SCHEDULED: _scheduled,
        JobState.DEFERRED: _deferred,
        JobState.DONE: _done,
        JobState.DEAD: _dead,
        JobState.CANCELLED: _cancelled,
    }[listed]
    total, jobs = yield from read(qk, limit, offset)
    return JobPage(state=listed, total=total, offset=offset, limit=limit, jobs=jobs)


def _reply(value: Any, default: Any) -> Any:
    return default if value is None or isinstance(value, Exception) else value


def _records(qk: TaskKeys, ids: Sequence[str]) -> Plan[list[Mapping[bytes, bytes]]]:
    if not ids:
        return []
    trip = Trip(errors=True)
    for job_id in ids:  # what a status needs: not the payload or result a record keeps
        trip.hmget(qk.job(job_id), STATUS_FIELDS)
    return [status_record(r) for r in (yield trip)]


def _by_record(qk: TaskKeys, ids: Sequence[str]) -> Plan[list[JobStatus]]:
    """The status of each of ``ids`` that has a whole record (one expired is left out)."""
    records = yield from _records(qk, ids)
    now = time.time()
    name = qk.task_id
    return [
        job_status(name, i, r, [], now) for i, r in zip(ids, records, strict=True) if has_state(r)
    ]


def _queued(qk: TaskKeys, limit: int, offset: int) -> Plan[Listed]:
    """The jobs on the queue's streams no member has read, in the order members read them
    (its priority bands above 0, highest first, its own stream, its bands below 0), then
    those set aside that no member has read (each handler's aside stream in turn, by the
    handler's path), then those waiting for a group slot (each group's wait list in turn,
    by the group's name)."""
    trip = Trip(errors=True)
    trip.smembers(qk.bands)
    trip.hgetall(qk.groups_waiting)
    trip.smembers(qk.aside)
    bands, waiting, aside_set = yield trip
    streams = qk.read_order(bands_of(_reply(bands, [])))
    trip = Trip(errors=True)
    for stream in streams:
        trip.xlen(stream)
        trip.xpending(stream, qk.group)
        trip.xinfo_groups(stream)
    replies = yield trip
    unread = [_unread_count(*replies[3 * i : 3 * i + 2]) for i in range(len(streams))]
    aside = yield from plan_aside_counts(qk, aside_set)
    counts = group_counts(_reply(waiting, {}))
    total = sum(unread) + sum(aside.waiting.values()) + sum(counts.values())
    jobs: list[JobStatus] = []
    skip, need = offset, limit
    for i, (stream, n) in enumerate(zip(streams, unread, strict=True)):
        if need <= 0:
            break
        if skip >= n:
            skip -= n
            continue
        groups = _reply(replies[3 * i + 2], [])
        jobs += yield from _unread(qk, stream, groups, min(n - skip, need), skip, n)
        skip, need = 0, limit - len(jobs)
    for handler, n in sorted(aside.waiting.items()):
        if need <= 0:
            break
        if skip >= n:
            skip -= n
            continue
        take = min(n - skip, need)
        jobs += yield from _set_aside(qk, handler, take, skip, n)
        skip, need = 0, need - take
    if need > 0 and counts:
        jobs += yield from _waiting(qk, sorted(counts), skip, need)
    return total, jobs


def _set_aside(
    qk: TaskKeys, handler: str, limit: int, offset: int, unread: int
) -> Plan[list[JobStatus]]:
    """A page of the jobs set aside on ``handler``'s stream that no member has read."""
    stream = qk.aside_stream(handler)
    trip = Trip(errors=True)
    trip.xinfo_groups(stream)
    groups = _reply((yield trip)[0], [])
    return (yield from _unread(qk, stream, groups, limit, offset, unread))


def _unread(
    qk: TaskKeys, stream: str, groups: Sequence[Any], limit: int, offset: int, unread: int
) -> Plan[list[JobStatus]]:
    """A page of ``stream``'s entries (the queue's, or an aside stream) after its group's
    last delivered one (``unread`` of them): from its end when that is nearer."""
    last = next((g["last-delivered-id"] for g in groups if text(g["name"]) == qk.group), b"0-0")
    after = f"({text(last)}"
    trip = Trip(errors=True)
    if offset >= unread:
        return []
    backwards = unread - offset < offset + limit  # its end is nearer
    if backwards:  # entries offset .. offset + limit are among the last unread - offset
        trip.xrevrange(stream, "+", after, count=unread - offset)
    else:
        trip.xrange(stream, after, "+", count=offset + limit)
    read = _reply((yield trip)[0], [])
    read = read[::-1][:limit] if backwards else read[offset:]
    entries = [
        (job, fields) for eid, fields in read if (job := entry_job(text(eid), fields)) is not None
    ]
    records = yield from _records(qk, [job.job_id for job, _ in entries])
    now = time.time()
    return [
        job_status(qk.task_id, job.job_id, running_record(fields, raw), [], now)
        for (job, fields), raw in zip(entries, records, strict=True)
    ]


def _waiting(qk: TaskKeys, groups: Sequence[str], skip: int, need: int) -> Plan[list[JobStatus]]:
    """``need`` jobs waiting for a slot of ``groups`` after the first ``skip`` (positions
    in the wait lists: a job cancelled while it waited keeps its place, and is left out)."""
    trip = Trip(errors=True)
    for group in groups:
        trip.llen(qk.group_wait(group))
    lengths = [int(_reply(n, 0)) for n in (yield trip)]
    trip = Trip(errors=True)
    for group, n in zip(groups, lengths, strict=True):
        if need <= 0:
            break
        if skip >= n:
            skip -= n
            continue
        take = min(n - skip, need)
        trip.lrange(qk.group_wait(group), skip, skip + take - 1)
        skip, need = 0, need - take
    if not len(trip):
        return []
    items = [w for reply in (yield trip) for raw in _reply(reply, []) if (w := wait_item(raw))]
    records = yield from _records(qk, [job_id for job_id, _ in items])
    now = time.time()
    return [
        job_status(qk.task_id, job_id, running_record(fields, raw), [], now)
        for (job_id, fields), raw in zip(items, records, strict=True)
        if raw.get(JOB_STATE.encode()) == JobState.QUEUED.value.encode()
    ]


def _running(qk: TaskKeys, limit: int, offset: int) -> Plan[Listed]:
    """The jobs members hold on the queue's stream, then on each aside stream (jobs set
    aside that a member that may run them took), by handler: each oldest read first."""
    trip = Trip(errors=True)
    trip.xpending(qk.stream, qk.group)
    trip.xpending_range(qk.stream, qk.group, "-", "+", offset + limit)
    trip.smembers(qk.aside)
    trip.smembers(qk.bands)
    *pending, aside_set, bands = yield trip
    banded = [b for b in qk.read_order(bands_of(_reply(bands, []))) if b != qk.stream]
    streams = [qk.stream, *banded, *(qk.aside_stream(h) for h in aside_handlers(aside_set))]
    if len(streams) > 1:
        trip = Trip(errors=True)
        for stream in streams[1:]:
            trip.xpending(stream, qk.group)
            trip.xpending_range(stream, qk.group, "-", "+", offset + limit)
        pending += yield trip
    total, found = 0, []
    for i, stream in enumerate(streams):
        summary, reply = pending[2 * i : 2 * i + 2]
        total += _held(summary)
        found += [(stream, row) for row in running_rows(_reply(reply, []))]
    page = found[offset : offset + limit]
    if not page:
        return total, []
    trip = Trip(errors=True)
    for stream, row in page:
        trip.xrange(stream, row["message_id"], row["message_id"], count=1)
    held = running_entries([row for _, row in page], (yield trip))
    records = yield from _records(qk, [entry.job_id for _, entry, _ in held])
    now = time.time()
    jobs = [
        job_status(qk.task_id, entry.job_id, running_record(fields, raw), [row], now)
        for (row, entry, fields), raw in zip(held, records, strict=True)
    ]
    return total, jobs


def _ranked(qk: TaskKeys, key: str, limit: int, offset: int) -> Plan[tuple[int, list[str]]]:
    trip = Trip()
    trip.zcard(key)
    trip.zrange(key, offset, offset + limit - 1)
    total, ids = yield trip
    return int(total), [text(i) for i in ids]


def _scheduled(qk: TaskKeys, limit: int, offset: int) -> Plan[Listed]:
    total, ids = yield from _ranked(qk, qk.scheduled, limit, offset)
    return total, (yield from _by_record(qk, ids))


def _deferred(qk: TaskKeys, limit: int, offset: int) -> Plan[Listed]:
    total, ids = yield from _ranked(qk, qk.deferred, limit, offset)
    if not ids:
        return total, []
    trip = Trip(errors=True)
    for job_id in ids:
        trip.hgetall(qk.job(job_id))
        trip.smembers(qk.deps(job_id))
    replies = yield trip
    now, out = time.time(), []
    for i, job_id in enumerate(ids):
        raw, waits = _reply(replies[2 * i], {}), _reply(replies[2 * i + 1], set())
        if has_state(raw):
            deps = sorted(text(w) for w in waits)
            out.append(job_status(qk.task_id, job_id, raw, [], now, deps))
    return total, out


def _done(qk: TaskKeys, limit: int, offset: int) -> Plan[Listed]:
    trip = Trip()
    trip.llen(qk.done)
    trip.lrange(qk.done, offset, offset + limit - 1)
    total, ids = yield trip
    return int(total), (yield from _by_record(qk, [text(i) for i in ids]))


def _dead(qk: TaskKeys, limit: int, offset: int) -> Plan[Listed]:
    trip = Trip()
    trip.xlen(qk.dead)
    total = int((yield trip)[0])
    if offset >= total:
        return total, []
    trip = Trip()
    if total - offset < offset + limit:  # the oldest are nearer: read from the start
        trip.xrange(qk.dead, "-", "+", count=total - offset)
        entries = (yield trip)[0][::-1][:limit]
    else:
        trip.xrevrange(qk.dead, "+", "-", count=offset + limit)
        entries = (yield trip)[0][offset:]
    letters = [decode_dead_letter(raw, errors="replace") for _, raw in entries]
    letters = [f for f in letters if f[DEAD_JOB] and JOB_ID.match(str(f[DEAD_JOB]).encode())]
    ids = [str(f[DEAD_JOB]) for f in letters]
    records = yield from _records(qk, ids)
    now = time.time()
    jobs = [
        job_status(qk.task_id, i, raw if has_state(raw) else _from_letter(f), [], now)
        for i, f, raw in zip(ids, letters, records, strict=True)
    ]
    return total, jobs


def _cancelled(qk: TaskKeys, limit: int, offset: int) -> Plan[Listed]:
    trip = Trip()
    trip.llen(qk.cancelled)
    trip.lrange(qk.cancelled, offset, offset + limit - 1)
    total, ids = yield trip
    return int(total), (yield from _by_record(qk, [text(i) for i in ids]))


def _unread_count(length: Any, pending: Any) -> int:
    """A stream's entries no member has read: its length less its pending ones."""
    return max(0, int(_reply(length, 0)) - int(_reply(pending, {}).get("pending") or 0))


def _held(summary: Any) -> int:
    """The entries members hold (run), from a stream's XPENDING summary: a parked
    entry (``PARKED``) runs on no member."""
    consumers = _reply(summary, {}).get("consumers") or []
    return sum(int(c["pending"]) for c in consumers if text(c["name"]) != PARKED)


def matches(job: JobStatus, wanted: str) -> bool:
    """Whether ``job``'s id starts with ``wanted``, or its handler or error (or last
    error, or reason) has it (case aside)."""
    if job.id.startswith(wanted):
        return True
    low = wanted.lower()
    said = (job.handler, job.error, job.last_error, job.reason)
    return any(low in s.lower() for s in said if s)


def plan_find_jobs(
    keys: Keys, name: str, state: str, wanted: str, limit: int = 20, offset: int = 0
) -> Plan[tuple[JobPage, int, bool]]:
    """The page of queue ``name``'s jobs in ``state`` that match ``wanted`` (``matches``):
    ``limit`` of them after ``offset``, their ``total``; with how many jobs were looked
    through and whether that was all of the state's (at most ``SEARCHED`` are)."""
    listed = check_page(state, limit, offset)
    if not wanted.strip() or len(wanted) > 200:
        raise ValueError(f"q must be 1 to 200 characters, not {wanted[:40]!r}")
    found: list[JobStatus] = []
    seen, total = 0, 0
    while seen < SEARCHED:
        page = yield from plan_jobs(keys, name, listed.value, SEARCH_BATCH, seen)
        found += [j for j in page.jobs if matches(j, wanted)]
        seen += SEARCH_BATCH
        total = page.total
        if seen >= total:
            break
    jobs = found[offset : offset + limit]
    page = JobPage(state=listed, total=len(found), offset=offset, limit=limit, jobs=jobs)
    return page, min(seen, total), seen >= total


def plan_job_counts(keys: Keys, name: str) -> Plan[dict[str, int]]:
    """How many of queue ``name``'s jobs are in each state of ``LISTED``, each as its
    list's ``total`` (``plan_jobs``) counts it: one round trip, two when jobs are set
    aside or prioritised."""
    qk = keys.task(check_task_id(name, "queue name"))
    trip = Trip(errors=True)
    trip.xlen(qk.stream)
    trip.xpending(qk.stream, qk.group)
    trip.hgetall(qk.groups_waiting)
    trip.smembers(qk.aside)
    trip.zcard(qk.scheduled)
    trip.zcard(qk.deferred)
    trip.llen(qk.done)
    trip.xlen(qk.dead)
    trip.llen(qk.cancelled)
    trip.smembers(qk.bands)
    length, pending, waiting, aside_set, *sized, bands = yield trip
    handlers = aside_handlers(aside_set)
    queued = _unread_count(length, pending) + sum(group_counts(_reply(waiting, {})).values())
    running = _held(pending)
    others = [qk.band(b) for b in bands_of(_reply(bands, []))]
    others += [qk.aside_stream(h) for h in handlers]
    if others:
        trip = Trip(errors=True)
        for stream in others:
            trip.xlen(stream)
            trip.xpending(stream, qk.group)
        replies = yield trip
        for i in range(len(others)):
            queued += _unread_count(replies[2 * i], replies[2 * i + 1])
            running += _held(replies[2 * i + 1])
    scheduled, deferred, done, dead, cancelled = (int(_reply(n, 0)) for n in sized)
    counts = {
        JobState.QUEUED: queued,
        JobState.SCHEDULED: scheduled,
        JobState.DEFERRED: deferred,
        JobState.RUNNING: running,
        JobState.DONE: done,
        JobState.DEAD: dead,
        JobState.CANCELLED: cancelled,
    }
    return {state.value: counts[state] for state in LISTED}


def _from_letter(f: Mapping[str, str | None]) -> dict[bytes, bytes]:
    """A dead job's record as its dead letter tells it (its own expired, or never written)."""
    attempts = f[DEAD_ATTEMPTS] or ""
    fields = {
        JOB_STATE: JobState.DEAD.value,
        JOB_HANDLER: f[DEAD_HANDLER] or "",
        JOB_REASON: f[DEAD_REASON] or "dead",
        JOB_ERROR: f[DEAD_ERROR] or "",
        JOB_ATTEMPTS: attempts if attempts.isdigit() else "",
        JOB_FINISHED: f[DEAD_TS] or "",
    }
    return {k.encode(): v.encode() for k, v in fields.items() if v}


def plan_job_detail(keys: Keys, name: str, job_id: str) -> Plan[JobDetail]:
    """Job ``job_id`` of queue ``name`` in full: its status (``LookupError`` if there is no
    such job), its payload while one is kept, its result, its traceback."""
    if not JOB_ID.match(job_id.encode()):
        raise LookupError(f"queue {name!r} has no job {job_id!r}")
    status = yield from plan_job_status_of(keys, name, job_id)
    qk = keys.task(name)
    trip = Trip(errors=True)
    trip.hgetall(qk.job(job_id))
    if ENTRY_ID.match(job_id):
        trip.xrange(qk.stream, job_id, job_id, count=1)
    replies = yield trip
    record = {k.decode(): v for k, v in _reply(replies[0], {}).items()}
    entry = _reply(replies[1], []) if len(replies) > 1 else []
    payload = record.get(JOB_PAYLOAD)
    where = record.get(JOB_ENTRY)
    if entry:
        payload = payload or entry[0][1].get(ENTRY_PAYLOAD.encode())
        where = where or entry[0][0]
    if payload is None and where is not None and not entry:
        # released off the record (a delayed or deferred job, a retry, a prioritised
        # job): on its entry now, on its band's stream
        entry = yield from _entry(qk.stream_of(job_id), where)
        payload = entry[0][1].get(ENTRY_PAYLOAD.encode()) if entry else None
    if payload is None and status.state == JobState.DEAD:
        payload = yield from _dead_payload(qk, job_id)
    result = record.get(JOB_RESULT) if status.state == JobState.DONE else None
    options = record.get(JOB_OPTIONS) or (
        entry[0][1].get(ENTRY_OPTIONS.encode()) if entry else None
    )
    group = JobOptions.parse(options).group
    if payload is None and status.state == JobState.QUEUED and not where and group:
        payload = yield from _waiting_payload(qk, job_id, group)  # off the stream: waits
    return JobDetail(
        **status.model_dump(),
        payload=None if payload is None else text(payload),
        result=None if result is None else text(result),
        traceback=text(record[JOB_ERROR]) if record.get(JOB_ERROR) else None,
        entry=None if where is None else text(where),
        options=JobOptions.parse(options).given_only(),
        trace_id=trace_id(options) or (text(record[JOB_TRACE]) if JOB_TRACE in record else None),
    )


TRACEPARENT = re.compile(r'"tp":"00-([0-9a-f]{32})-')


def trace_id(options: bytes | str | None) -> str | None:
    """The trace id in a job's options (its producer's: ``queueworks.tracing``), if any."""
    if not options:
        return None
    found = TRACEPARENT.search(text(options))
    return found.group(1) if found else None


def _entry(stream: str, entry_id: bytes) -> Plan[list[Any]]:
    """Entry ``entry_id`` of ``stream`` (the queue's, or a priority band's), as ``XRANGE``
    gives it (empty: gone, or on another stream)."""
    trip = Trip(errors=True)
    trip.xrange(stream, entry_id, entry_id, count=1)
    found: list[Any] = _reply((yield trip)[0], [])
    return found


def _waiting_payload(qk: TaskKeys, job_id: str, group: str) -> Plan[bytes | None]:
    """The payload of a job waiting for a slot of ``group``, from its item among the
    ``WAIT_LOOKED`` oldest of the group's wait list."""
    trip = Trip()
    trip.lrange(qk.group_wait(group), 0, WAIT_LOOKED - 1)
    for raw in (yield trip)[0]:
        item = wait_item(raw)
        if item is not None and item[0] == job_id:
            return item[1].get(ENTRY_PAYLOAD.encode())
    return None


def _dead_payload(qk: TaskKeys, job_id: str) -> Plan[bytes | None]:
    """A dead job's payload, from its dead letter among the newest ``DEAD_LOOKED``."""
    trip = Trip()
    trip.xrevrange(qk.dead, "+", "-", count=DEAD_LOOKED)
    for _, raw in (yield trip)[0]:
        if raw.get(DEAD_JOB.encode()) == job_id.encode():
            found: bytes | None = raw.get(DEAD_PAYLOAD.encode())
            return found
    return None
