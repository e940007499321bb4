"""Operator actions on a whole queue, planned once (``queueworks.transport.plans``) for ``Queue``,
``AsyncQueue``, the dashboard and ``queueworks queue``: pause and resume, empty (drop the
backlog), requeue or delete every dead letter, run a scheduled job now.

Each is bounded: what it goes through is fixed when it starts (the stream's newest entry
then), in batches of ``BATCH``, so jobs that keep arriving cannot make it chase them. Each
emits one event saying what it did.

* **pause** sets the queue's ``paused`` flag (``pause_queue.lua``): its members read no new
  job (they see it with the membership check they already make, every 50 ms) while jobs
  keep arriving; what they had read, they run. **resume** clears it.
* **empty** cancels every job on the stream that no member has read, and every job waiting
  for a group slot (``cancel_job.lua``, one call per job, a batch a round trip): each is
  recorded cancelled, its unique key is freed and the jobs that wait for it die with it, as
  ``job.cancel()`` does; so are the jobs set aside (waiting alone on their handler's
  aside stream for a member that may run them) that no member has read. Scheduled,
  deferred and running jobs are left as they are.
* **requeue-dead** puts every dead letter that was a job back on the stream
  (``requeue_job.lua``, oldest first); **delete-dead** drops them all (the jobs stay
  counted as dead).
* **run now** moves a scheduled job (delayed, or a retry waiting) onto the stream at once
  (``promote_due.lua``, as its due time would).
"""

from __future__ import annotations

import time
from typing import Any

from queueworks.errors import TaskNotFound
from queueworks.protocol import events
from queueworks.protocol.jobrecords import DEAD_JOB, JOB_ID, entry_job
from queueworks.protocol.keys import Keys, TaskKeys, check_task_id
from queueworks.protocol.messages import text
from queueworks.protocol.models import StoredSpec, TaskState
from queueworks.protocol.priorities import bands_of
from queueworks.queue.aside_jobs import aside_handlers
from queueworks.queue.flow import Limits, plan_pump, wait_item
from queueworks.queue.queues import CANCELLED_LAST
from queueworks.scripts import calls
from queueworks.task.dependencies import plan_drain
from queueworks.transport.plans import Plan, Trip, alone

BATCH = 100  # entries a round trip goes through


def _queue(keys: Keys, name: str) -> Plan[tuple[TaskKeys, StoredSpec, TaskState]]:
    """The queue's keys, spec and state; ``TaskNotFound`` for a name that is no queue."""
    qk, _, spec, found = yield from _read(keys, name)
    return qk, spec, found


def queue_spec(keys: Keys, name: str) -> Plan[tuple[TaskKeys, bytes, StoredSpec]]:
    """The queue's keys and spec, as stored and read; ``TaskNotFound`` if it is no queue."""
    qk, raw, spec, _ = yield from _read(keys, name)
    return qk, raw, spec


def _read(keys: Keys, name: str) -> Plan[tuple[TaskKeys, bytes, StoredSpec, TaskState]]:
    qk = keys.task(check_task_id(name, "queue name"))
    trip = Trip()
    trip.hmget(qk.record, ["spec", "state"])
    spec_raw, state = (yield trip)[0]
    try:
        spec = StoredSpec.model_validate_json(spec_raw or b"")
        found = TaskState(text(state))
    except ValueError:
        raise TaskNotFound(f"queue {name}") from None
    if spec.mode != "queue":
        raise TaskNotFound(f"queue {name}")
    return qk, spec_raw, spec, found


def _open(keys: Keys, name: str, doing: str) -> Plan[tuple[TaskKeys, StoredSpec]]:
    qk, spec, state = yield from _queue(keys, name)
    if state.finished:
        raise ValueError(f"queue {name} is {state.value}: it cannot {doing}")
    return qk, spec


def plan_pause(keys: Keys, name: str, paused: bool) -> Plan[bool]:
    """Pause (``paused``) or resume queue ``name``; whether that changed anything."""
    qk, _ = yield from _open(keys, name, "be paused or resumed")
    changed = (yield alone(calls.pause_queue(qk, paused)))[0]
    if changed < 0:
        raise TaskNotFound(f"queue {name}")
    if changed:
        trip = Trip()
        events.emit(trip, keys, "paused" if paused else "resumed", task=name)
        yield trip
    return bool(changed)


def _newest(trip_reply: Any) -> str | None:
    return text(trip_reply[0][0]) if trip_reply else None


Freed = list[tuple[str, str, float | None]]  # unique key, its job, its unique_for


def plan_empty(keys: Keys, name: str) -> Plan[int]:
    """Cancel every job of the queue's backlog (read by no member: on its stream, set
    aside, and waiting for a group slot): how many."""
    qk, spec = yield from _open(keys, name, "be emptied")
    ttl = int(spec.result_ttl)
    freed: Freed = []
    emptied, grouped, _ = yield from _empty_stream(qk, ttl, freed)
    trip = Trip()
    trip.smembers(qk.bands)
    for band in bands_of((yield trip)[0]):  # the jobs of its priority bands
        n, more, _ = yield from _empty_stream(qk, ttl, freed, stream=qk.band(band))
        emptied += n
        for group, ids in more.items():
            grouped.setdefault(group, []).extend(ids)
    trip = Trip()
    trip.smembers(qk.aside)
    handlers_gone = False  # the last job of a handler set aside went: its handler too
    for handler in aside_handlers((yield trip)[0]):
        n, more, last = yield from _empty_stream(qk, ttl, freed, handler)
        emptied, handlers_gone = emptied + n, handlers_gone or last
        for group, ids in more.items():
            grouped.setdefault(group, []).extend(ids)
    emptied += yield from _empty_waiting(qk, ttl, freed)
    trip = Trip()
    for key, job_id, unique_for in freed:
        trip.call(calls.release_unique(qk, key, job_id, unique_for))
    if handlers_gone:
        events.emit(trip, keys, "handlers", task=name)
    events.emit(trip, keys, "emptied", task=name, jobs=emptied)
    yield trip
    limit = Limits.of(spec).group or 0
    for group, ids in grouped.items():  # the slots they held go on (their waiting jobs were
        yield from plan_pump(qk, limit, {group: len(ids)}, back=ids)  # cancelled: passed)
    if emptied:
        yield from plan_drain(keys, [name])  # the jobs that waited for them die with them
    return emptied


def _cancel(
    qk: TaskKeys, ids: list[str], ttl: int, freed: Freed, aside: str = ""
) -> Plan[list[tuple[str, str | None, bool]]]:
    """Cancel ``ids`` (one trip; ``aside``: the handler whose aside stream they are on):
    those cancelled, each with its group (None: none) and whether it was the last of its
    handler set aside; their unique keys go to ``freed``."""
    trip, now = Trip(), time.time()
    for job_id in ids:
        trip.call(calls.cancel_job(qk, job_id, now, ttl, aside=aside))
    cancelled: list[tuple[str, str | None, bool]] = []
    for job_id, (found, options, _) in zip(ids, (yield trip), strict=True):
        if found in (1, CANCELLED_LAST):
            if options is not None and options.key is not None:
                freed.append((options.key, job_id, options.unique_for))
            group = options.group if options is not None else None
            cancelled.append((job_id, group, found == CANCELLED_LAST))
    return cancelled


def _empty_stream(
    qk: TaskKeys, ttl: int, freed: Freed, aside: str = "", stream: str = ""
) -> Plan[tuple[int, dict[str, list[str]], bool]]:
    """Cancel the jobs no member has read of the stream (the queue's, the aside stream of
    handler ``aside``, or ``stream``: a priority band's): how many, by group the jobs
    whose slot goes back (one the pump handed on holds its group's), and whether the last
    set aside of ``aside`` went (its stream and handler with it)."""
    stream = stream or (qk.aside_stream(aside) if aside else qk.stream)
    trip = Trip(errors=True)
    trip.xrevrange(stream, "+", "-", count=1)
    trip.xinfo_groups(stream)
    newest, groups = yield trip
    end = None if isinstance(newest, Exception) else _newest(newest)
    grouped: dict[str, list[str]] = {}  # group -> emptied jobs of it (a slot they held goes)
    if end is None or isinstance(groups, Exception):
        return 0, grouped, False
    last = next((g["last-delivered-id"] for g in groups if text(g["name"]) == qk.group), b"0-0")
    cursor, emptied, gone = f"({text(last)}", 0, False
    while not gone:
        trip = Trip(errors=True)  # (an aside stream goes with its last job)
        trip.xrange(stream, cursor, end, count=BATCH)
        entries = _entries((yield trip)[0])
        if not entries:
            break
        cursor = f"({text(entries[-1][0])}"
        ids = [j.job_id for eid, f in entries if (j := entry_job(text(eid), f)) is not None]
        cancelled = yield from _cancel(qk, ids, ttl, freed, aside)
        emptied += len(cancelled)
        for job_id, group, went in cancelled:
            gone = gone or went
            if group is not None:
                grouped.setdefault(group, []).append(job_id)
    return emptied, grouped, gone


def _entries(reply: Any) -> list[Any]:
    return [] if isinstance(reply, Exception) or not reply else list(reply)


def _empty_waiting(qk: TaskKeys, ttl: int, freed: Freed) -> Plan[int]:
    """Cancel the jobs waiting for a group slot (those on each group's wait list now, in
    batches): how many. They stay on their lists, counted out; the pump passes them over."""
    trip = Trip()
    trip.hkeys(qk.groups_waiting)
    emptied = 0
    for group in sorted(text(g) for g in (yield trip)[0]):
        trip = Trip()
        trip.llen(qk.group_wait(group))
        length = int((yield trip)[0])
        for start in range(0, length, BATCH):
            trip = Trip()
            trip.lrange(qk.group_wait(group), start, start + BATCH - 1)
            items = [w for raw in (yield trip)[0] if (w := wait_item(raw)) is not None]
            emptied += len((yield from _cancel(qk, [j for j, _ in items], ttl, freed)))
    return emptied


def plan_requeue_dead(keys: Keys, name: str) -> Plan[int]:
    """Put every dead letter of the queue that was a job back on its stream, oldest first
    (those there when it starts): how many."""
    qk, _ = yield from _open(keys, name, "take jobs back")
    trip = Trip()
    trip.xrevrange(qk.dead, "+", "-", count=1)
    end = _newest((yield trip)[0])
    cursor, requeued = "-", 0
    while end is not None:
        trip = Trip()
        trip.xrange(qk.dead, cursor, end, count=BATCH)
        entries = (yield trip)[0]
        if not entries:
            break
        cursor = f"({text(entries[-1][0])}"
        trip, now = Trip(), time.time()
        for eid, raw in entries:
            job = raw.get(DEAD_JOB.encode()) or b""
            if job and JOB_ID.match(job):  # a rejected entry (no job) stays
                trip.call(calls.requeue_job(qk, text(eid), text(job), now))
        if len(trip):
            requeued += sum(1 for reply in (yield trip) if int(reply[0]) == 1)
    trip = Trip()
    events.emit(trip, keys, "requeued", task=name, jobs=requeued)
    yield trip
    return requeued


def plan_delete_dead(keys: Keys, name: str) -> Plan[int]:
    """Drop every dead letter of the queue (its jobs stay counted as dead): how many."""
    qk, _, _ = yield from _queue(keys, name)
    trip = Trip()
    trip.xtrim(qk.dead, maxlen=0, approximate=False)
    dropped = int((yield trip)[0])
    trip = Trip()
    events.emit(trip, keys, "dead_letters_deleted", task=name, jobs=dropped)
    yield trip
    return dropped


def plan_run_now(keys: Keys, name: str, job_id: str) -> Plan[bool]:
    """Move scheduled job ``job_id`` onto the queue's stream now; False if it is not
    scheduled (it runs already, or has run, or is no job of the queue)."""
    if not JOB_ID.match(job_id.encode()):
        raise ValueError(f"job id {job_id[:80]!r} is no job id")
    qk, _ = yield from _open(keys, name, "run jobs")
    moved = (yield alone(calls.promote_due(qk, [job_id])))[0]
    if moved:
        trip = Trip()
        events.emit(trip, keys, "run_now", task=name, job=job_id)
        yield trip
    return bool(moved)
