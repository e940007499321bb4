"""A queue's schedules, planned once (``queueworks.transport.plans``) for ``Queue`` and
``AsyncQueue``:
write one (or replace it), list them, remove one. What is stored and how it fires:
``queueworks.queue.schedules``; who fires them: ``controller.scheduler``."""

from __future__ import annotations

import time
from typing import Any

from queueworks.protocol import events
from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.protocol.models import Schedule, TaskState
from queueworks.queue import schedules as sched
from queueworks.queue.queue_plans import QueueRef, plan_revive
from queueworks.queue.queues import tell_handlers
from queueworks.queue.vanished import record_gone
from queueworks.tracing import hooks
from queueworks.transport.plans import Plan, Trip


def plan_schedule(
    ref: QueueRef, name: str, handler: str, payload: Any, every: Any, cron: Any
) -> Plan[Schedule]:
    """Write the schedule ``name`` (replacing one of that name): its first due time is
    ``every`` s from now, or the cron expression's next time. ``ValueError`` naming what
    is wrong; ``QueueNotFound`` if the queue was cancelled."""
    sched.check_schedule_name(name)
    d = sched.definition(handler, payload, every, cron)
    producer = hooks.producer
    if producer is not None:  # tracing: its jobs' spans link to the context current here
        d = d._replace(options=producer.as_link(producer.carry("")))
    trip = Trip()
    trip.hget(ref.qk.record, "state")
    state = (yield trip)[0]
    if state is None or TaskState(text(state)).finished:
        record_gone(ref.name, state, ref.revives)  # QueueNotFound if it finished
        yield from plan_revive(ref)
    due = sched.first_due(d, round(time.time() * 1000))
    trip = Trip()
    trip.hset(ref.qk.schedules, name, sched.encode(d))
    trip.zadd(ref.qk.schedules_due, {name: due})
    if d.handler not in ref.known:
        tell_handlers(trip, ref.keys, ref.qk, [d.handler])
    trip.zadd(ref.keys.schedules, {sched.member(ref.name, name): due})
    events.emit(trip, ref.keys, "schedules", task=ref.name, schedule=name)
    last = trip.hget(ref.qk.schedules_last, name)
    replies = yield trip
    ref.known.add(d.handler)
    return sched.as_schedule(ref.name, name, sched.encode(d), due, replies[last])


def plan_schedules(keys: Keys, queue: str) -> Plan[list[Schedule]]:
    """The queue's schedules, by name (one stored unreadably, written by hand, is left out)."""
    qk = keys.task(queue)
    trip = Trip()
    trip.hgetall(qk.schedules)
    trip.zrange(qk.schedules_due, 0, -1, withscores=True)
    trip.hgetall(qk.schedules_last)
    defs, due, last = yield trip
    due_of = {text(m): score for m, score in due}
    out = []
    for raw_name, raw in sorted(defs.items()):
        name = text(raw_name)
        try:
            out.append(sched.as_schedule(queue, name, raw, due_of.get(name), last.get(raw_name)))
        except ValueError:
            continue
    return out


def plan_unschedule(ref: QueueRef, name: str) -> Plan[bool]:
    """Remove the schedule ``name`` from the queue and from the index: True if it existed."""
    sched.check_schedule_name(name)
    trip = Trip()
    trip.zrem(ref.keys.schedules, sched.member(ref.name, name))
    trip.hdel(ref.qk.schedules, name)
    trip.zrem(ref.qk.schedules_due, name)
    trip.hdel(ref.qk.schedules_last, name)
    replies = yield trip
    return bool(replies[1])
