"""What ``Client`` and ``AsyncClient`` read and write themselves (not through a task's or a
queue's handle), planned once (``queueworks.transport.plans``): the task index, the workers, a drain
request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from queueworks.protocol import events
from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.protocol.models import TaskStatus, WorkerRecord
from queueworks.protocol.records import BadRecord, worker_record
from queueworks.task.tasks import task_page, task_statuses
from queueworks.transport.plans import Plan, Trip


def plan_tasks(
    keys: Keys, limit: int | None, offset: int, newest_first: bool
) -> Plan[list[TaskStatus]]:
    """A page of the task index (one round trip), then its records (one pipeline)."""
    page = task_page(limit, offset)
    if page is None:
        return []
    trip = Trip()
    trip.zrange(keys.tasks, *page, desc=newest_first)
    ids = [text(t) for t in (yield trip)[0]]
    if not ids:
        return []
    trip = Trip()
    for tid in ids:
        trip.hgetall(keys.task(tid).record)
    return task_statuses(ids, (yield trip))


def plan_task_count(keys: Keys) -> Plan[int]:
    trip = Trip()
    trip.zcard(keys.tasks)
    return int((yield trip)[0])


def plan_workers(keys: Keys) -> Plan[list[WorkerRecord]]:
    trip = Trip()
    trip.zrange(keys.workers, 0, -1)
    ids = [text(w) for w in (yield trip)[0]]
    if not ids:
        return []
    trip = Trip()
    for wid in ids:
        trip.hgetall(keys.worker(wid))
    return worker_records((yield trip))


def plan_drain_worker(keys: Keys, worker_id: str) -> Plan[None]:
    """The worker's ``drain`` request and its event, in one round trip."""
    trip = Trip()
    trip.hset(keys.worker(worker_id), "drain", "1")
    events.emit(trip, keys, "drain_requested", worker=worker_id)
    yield trip


def worker_records(raws: Sequence[Any]) -> list[WorkerRecord]:
    """Worker records from their hashes (HGETALL replies), skipping gone or broken ones."""
    out = []
    for raw in raws:
        if raw and b"record" in raw:
            try:
                out.append(worker_record(raw))
            except BadRecord:
                continue  # one broken hash must not hide every other worker
    return out
