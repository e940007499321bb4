"""The keys of a queue's unfinished jobs, when the queue finishes or is reopened.

A finished queue's keys expire ``result_ttl`` after its end (the leader's release:
``TaskKeys.all``, its aside streams and group wait lists). A job that finished has its
record's expiry already; one that never did (queued, running, delayed, deferred, set
aside, waiting for a group slot or a retry's time) has keys that no list of the queue's
keys names: its record (``TaskKeys.job``), a deferred job's dependency set
(``TaskKeys.deps``) and the unique key it holds (``TaskKeys.unique``). ``plan_job_keys``
finds those jobs through what the queue indexes, never a scan of Redis: its stream and
aside streams (every entry there, read by a member or not, is a job not settled), its
``scheduled`` and ``deferred`` sorted sets, and its groups' wait lists; then, in
``BATCH`` jobs a script call, it gives their keys the record's expiry
(``expire_jobs.lua``, the leader's ``controller.leftovers``), or keeps them again
(``keep_jobs.lua``, a reopen). Each call checks the queue's record first, so a walk stops at
the first batch after the queue is reopened (or finished again).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from queueworks.protocol.job_options import JobOptions
from queueworks.protocol.jobrecords import ENTRY_JOB, ENTRY_OPTIONS, JOB_OPTIONS, entry_job
from queueworks.protocol.keys import TaskKeys
from queueworks.protocol.messages import text
from queueworks.scripts import calls
from queueworks.task.dependencies import JOB_ID
from queueworks.transport.plans import Plan, Trip

BATCH = 500  # jobs read per round trip and given to one script call


class Job(NamedTuple):
    """An unfinished job: its id, the unique key it names (None: none), whether it may have
    a dependency set (a deferred job)."""

    id: str
    unique: str | None = None
    deferred: bool = False


def plan_job_keys(qk: TaskKeys, keep: bool = False) -> Plan[int]:
    """Give the keys of queue ``qk``'s unfinished jobs its record's expiry (``keep``: keep
    them again, the queue reopened), ``BATCH`` jobs at a time: a read and a script call (a
    sorted set's: a second read, of their records' options); how many jobs it did. It
    stops early once the queue is no longer finished (or, ``keep``, finished again): the
    call that finds it so does nothing."""
    trip = Trip()
    trip.smembers(qk.aside)
    trip.hkeys(qk.groups_waiting)
    aside, groups = yield trip
    streams = [qk.stream, *(qk.aside_stream(h) for h in sorted(text(a) for a in aside or ()))]
    walks = [
        *(_stream(qk, s, keep) for s in streams),
        _index(qk, qk.scheduled, False, keep),
        _index(qk, qk.deferred, True, keep),
        *(_wait_list(qk, qk.group_wait(g), keep) for g in sorted(text(g) for g in groups or ())),
    ]
    done = 0
    for walk in walks:
        n, going = yield from walk
        done += n
        if not going:
            break
    return done


Walked = tuple[int, bool]  # jobs done, and whether to go on (the queue is as it was)


def _stream(qk: TaskKeys, stream: str, keep: bool) -> Plan[Walked]:
    """Every entry of ``stream`` (read by a member or not: not settled), oldest first."""
    start, done = "-", 0
    while True:
        trip = Trip()
        trip.xrange(stream, start, "+", count=BATCH)
        entries = (yield trip)[0] or []
        jobs = []
        for entry_id, fields in entries:
            entry = entry_job(text(entry_id), fields)
            if entry is not None:
                jobs.append(Job(entry.job_id, entry.job_options.key))
        if jobs and not (yield from _apply(qk, jobs, keep)):
            return done, False
        done += len(jobs)
        if len(entries) < BATCH:
            return done, True
        start = "(" + text(entries[-1][0])


def _index(qk: TaskKeys, index: str, deferred: bool, keep: bool) -> Plan[Walked]:
    """The jobs of a sorted set of job ids (``scheduled``, ``deferred``), with the unique
    keys their records' options name, by rank (a finished queue's sets stay as they are:
    its members, who move due jobs, have left it)."""
    offset, done = 0, 0
    while True:
        trip = Trip()
        trip.zrange(index, offset, offset + BATCH - 1)
        ids = [text(j) for j in (yield trip)[0] or []]
        if not ids:
            return done, True
        trip = Trip()
        for job_id in ids:
            trip.hget(qk.job(job_id), JOB_OPTIONS)
        options = yield trip
        jobs = [
            Job(j, JobOptions.parse(o).key, deferred) for j, o in zip(ids, options, strict=True)
        ]
        if not (yield from _apply(qk, jobs, keep)):
            return done, False
        done += len(jobs)
        if len(ids) < BATCH:
            return done, True
        offset += BATCH


def _wait_list(qk: TaskKeys, wait_list: str, keep: bool) -> Plan[Walked]:
    """The jobs of a group's wait list (each item: JSON of its record key, ``j`` its id and
    ``f`` its entry's fields, flat: ``group_take.lua``)."""
    offset, done = 0, 0
    while True:
        trip = Trip()
        trip.lrange(wait_list, offset, offset + BATCH - 1)
        items = (yield trip)[0] or []
        jobs = [job for job in map(_waiting, items) if job is not None]
        if jobs and not (yield from _apply(qk, jobs, keep)):
            return done, False
        done += len(jobs)
        if len(items) < BATCH:
            return done, True
        offset += BATCH


def _waiting(raw: Any) -> Job | None:
    """The job of a wait list's item; None for one that cannot be (written by hand)."""
    try:
        item = json.loads(raw)
        flat = item["f"]
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        job_id = item.get("j") or fields[ENTRY_JOB]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(job_id, str) or not JOB_ID.match(job_id):
        return None
    return Job(job_id, JobOptions.parse(fields.get(ENTRY_OPTIONS) or None).key)


def _apply(qk: TaskKeys, jobs: Sequence[Job], keep: bool) -> Plan[bool]:
    """One script call for ``jobs``: whether the queue was as the walk expects."""
    trip = Trip()
    if keep:
        trip.call(calls.keep_jobs(qk, [(j.id, j.unique) for j in jobs]))
    else:
        trip.call(calls.expire_jobs(qk, list(_keys(qk, jobs))))
    return bool((yield trip)[0])


def _keys(qk: TaskKeys, jobs: Sequence[Job]) -> Iterator[str]:
    for job in jobs:
        yield qk.job(job.id)
        if job.deferred:
            yield qk.deps(job.id)
        if job.unique is not None:
            yield qk.unique(job.unique)
