"""Submitting a target task, planned once (``queueworks.transport.plans``) for both clients.

A task of at most ``SUBMIT_BATCH`` subtasks is written by one script (``submit_small.lua``:
one round trip on one server; on a cluster the queue, index and event follow in a
pipeline, since they live in other slots). A larger one streams its subtasks in batches of
``SUBMIT_BATCH`` (a Lua call each), ``SUBMIT_PIPELINE`` calls per round trip, under a lease:
its streams expire unless the record, written last, makes them permanent, so a submit that
dies half-way leaves nothing for good. A task of no subtasks completes at once, through the
one completion path (``settle``), with its ``completed`` event.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterable, Generator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from queueworks.errors import NotJSON, NotReplicated, SubmitError
from queueworks.job_functions import Call
from queueworks.protocol import events
from queueworks.protocol.keys import Keys, TaskKeys, check_task_id
from queueworks.protocol.messages import partition_of, to_json
from queueworks.protocol.models import TaskSpec
from queueworks.protocol.records import new_task
from queueworks.scripts import calls
from queueworks.transport.plans import Chunk, Plan, Step, Trip, alone
from queueworks.transport.replication import Replicas, acknowledged

if TYPE_CHECKING:
    from queueworks.client.aio_tasks import AsyncTask
    from queueworks.task.tasks import Task

SUBMIT_BATCH = 1000  # messages per Lua call
SUBMIT_PIPELINE = 8  # Lua calls per round trip
# A task's streams expire this long after the last write of a submit that has not finished
# (it died half-way): only the task record, written last, makes them permanent.
SUBMIT_LEASE_MS = 120_000

Message = tuple[int, int, str, str]  # (stream number, index, payload JSON, key)


def plan_submit(
    keys: Keys,
    spec: TaskSpec,
    task_id: str,
    wait_replicas: int,
    wait_timeout: float,
    cluster: bool,
) -> Plan[int | None]:
    """Write task ``task_id`` (see the module docstring); returns how many replicas
    acknowledged it (the fewest of any primary that holds it), None unless
    ``wait_replicas``. ``SubmitError`` naming a bad subtask: nothing is left behind."""
    tk = keys.task(task_id)
    streams = tk.streams(spec.partitions)
    wait = Replicas(wait_replicas, wait_timeout)
    source = subtask_source(spec)
    head = messages(spec.partitions, 0, (yield Chunk(source, SUBMIT_BATCH + 1)))
    if len(head) <= SUBMIT_BATCH:
        total = len(head)
        acked = yield from submit_small(keys, spec, tk, streams, head, wait, cluster)
    else:
        total, acked = yield from submit_large(keys, spec, tk, streams, head, source, wait)
    if total == 0:  # nothing to do: complete at once, through the one completion path
        yield alone(calls.settle(tk, streams[0], "client", time.time(), []))
        trip = Trip()
        events.emit(trip, keys, "completed", task=task_id)
        yield trip
    return acked


def wait_keys(keys: Keys, tk: TaskKeys) -> list[str]:
    """What a submit's WAIT (``Replicas.add``, at the end of its last trip) waits on: every
    node that holds one of the task's record, the queue of tasks, the index, the events."""
    return [tk.record, keys.queue, keys.tasks, keys.events]


def submit_small(
    keys: Keys,
    spec: TaskSpec,
    tk: TaskKeys,
    streams: list[str],
    batch: list[Message],
    wait: Replicas,
    cluster: bool,
) -> Plan[int | None]:
    """One script writes it all; on a cluster the queue, index and event follow."""
    now = time.time()
    record = new_task(spec, len(batch), now)
    event = events.event("submitted", task=tk.task_id, name=spec.name, total=len(batch))
    publish = None if cluster else (keys.queue, keys.tasks, keys.events, event)
    trip = Trip()
    trip.call(calls.submit_small(tk, streams, record, batch, now, publish))
    if cluster:  # the script alone (its slot), then the rest
        if not (yield trip)[0]:
            raise task_exists(tk.task_id)
        trip = Trip()
        publish_task(trip, keys, tk.task_id, now, event)
        waited = wait.add(trip, wait_keys(keys, tk))
        return acknowledged((yield trip), waited)
    waited = wait.add(trip, wait_keys(keys, tk))
    replies = yield trip
    if not replies[0]:
        raise task_exists(tk.task_id)
    return acknowledged(replies, waited)


def submit_large(
    keys: Keys,
    spec: TaskSpec,
    tk: TaskKeys,
    streams: list[str],
    head: list[Message],
    source: Iterator[Any] | Any,
    wait: Replicas,
) -> Generator[Step, Any, tuple[int, int | None]]:
    """Stream after stream of batches, the record last (it makes the streams permanent:
    a submit that dies half-way leaves streams that expire)."""
    trip = Trip()
    trip.exists(tk.record)
    if (yield trip)[0]:
        raise task_exists(tk.task_id)
    trip = Trip()
    open_streams(trip, tk, streams)
    yield trip
    try:
        total = yield from write_subtasks(streams, spec.partitions, head, source)
    except GeneratorExit:
        raise
    except BaseException:
        trip = Trip()
        trip.delete(*streams)
        yield trip
        raise
    now = time.time()
    trip = Trip()
    # on a cluster this runs at once: the record exists before anything lists the task
    trip.call(calls.record_task(tk, streams, new_task(spec, total, now)))
    record_steps(trip, keys, spec, tk.task_id, total, now)
    waited = wait.add(trip, wait_keys(keys, tk))
    return total, acknowledged((yield trip), waited)


def write_subtasks(
    streams: list[str], partitions: int, head: list[Message], source: Any
) -> Plan[int]:
    """The subtasks in batches, ``SUBMIT_PIPELINE`` Lua calls a round trip (the streams'
    lease renewed with each); how many there were."""
    pending, total, more = head, len(head), True
    trip, queued = Trip(), 0
    while pending or more:
        while len(pending) >= SUBMIT_BATCH or (pending and not more):
            trip.call(calls.enqueue(streams, pending[:SUBMIT_BATCH]))
            pending, queued = pending[SUBMIT_BATCH:], queued + 1
            if queued >= SUBMIT_PIPELINE:
                keep_lease(trip, streams)
                yield trip
                trip, queued = Trip(), 0
        if more:
            items = yield Chunk(source, SUBMIT_BATCH)
            more = len(items) == SUBMIT_BATCH
            pending += messages(partitions, total, items)
            total += len(items)
    if len(trip):
        yield trip
    return total


# -- what the clients check before they plan, and the commands the plan records -------------


def submit_task_id(
    spec: TaskSpec, task_id: str | None, wait_replicas: int, wait_timeout: float
) -> str:
    """The id of a task to submit (a new one unless given); checks submit's arguments."""
    if wait_replicas < 0 or wait_timeout <= 0:
        raise ValueError("submit: need wait_replicas >= 0 and wait_timeout > 0")
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"submit: spec must be a TaskSpec, got {type(spec).__name__}")
    return check_task_id(task_id or uuid.uuid4().hex[:16])


def sync_subtasks(spec: TaskSpec) -> Iterable[Any]:
    """The subtasks of a spec for a sync submit: an async iterable is for AsyncClient."""
    if not isinstance(spec.subtasks, Iterable):
        raise SubmitError("subtasks: an async iterable needs AsyncClient.submit")
    return spec.subtasks


def subtask_source(spec: TaskSpec) -> Any:
    """An iterator (or async iterator) over the spec's subtasks, for ``Chunk`` steps."""
    subtasks: Any = spec.subtasks
    if isinstance(subtasks, AsyncIterable):
        return aiter(subtasks)
    return iter(subtasks)


def task_exists(task_id: str) -> SubmitError:
    return SubmitError(f"task_id: a task {task_id!r} exists already")


def open_streams(pipe: Any, tk: TaskKeys, streams: Sequence[str]) -> None:
    """Queue on ``pipe`` the creation of a task's streams, under the submit lease."""
    for stream in streams:
        pipe.xgroup_create(stream, tk.group, id="0", mkstream=True)
        pipe.pexpire(stream, SUBMIT_LEASE_MS)


def keep_lease(pipe: Any, streams: Sequence[str]) -> None:
    """Still submitting: the streams' lease runs from now again."""
    for stream in streams:
        pipe.pexpire(stream, SUBMIT_LEASE_MS)


def messages(partitions: int, start: int, payloads: Sequence[Any]) -> list[Message]:
    """``subtask_message`` of each payload, indexed from ``start``."""
    return [subtask_message(partitions, start + i, p) for i, p in enumerate(payloads)]


def subtask_message(partitions: int, index: int, payload: Any) -> Message:
    """Subtask ``index`` as ``(stream number, index, payload JSON, key)`` for
    ``scripts.enqueue``; ``SubmitError`` naming the subtask if it cannot be one."""
    try:
        body = payload.body if isinstance(payload, Call) else to_json(payload, f"subtasks[{index}]")
    except NotJSON as exc:
        raise SubmitError(str(exc)) from None
    if not partitions:
        return 0, index, body, ""
    if not isinstance(payload, dict) or "key" not in payload:
        raise SubmitError(f"subtasks[{index}]: a partitioned task needs dict payloads with a 'key'")
    key = str(payload["key"])
    return partition_of(key, partitions), index, body, key


def record_steps(pipe: Any, keys: Keys, spec: TaskSpec, tid: str, total: int, now: float) -> None:
    """Queue on ``pipe`` what follows the record (``scripts.record_task``): the task in the
    queue of tasks and in the index, and its ``submitted`` event."""
    publish_task(
        pipe, keys, tid, now, events.event("submitted", task=tid, name=spec.name, total=total)
    )


def publish_task(pipe: Any, keys: Keys, task_id: str, now: float, event: dict[str, str]) -> None:
    """Queue, index and announce a task whose record is written."""
    pipe.zadd(keys.queue, {task_id: now})
    pipe.zadd(keys.tasks, {task_id: now})
    pipe.xadd(keys.events, event, maxlen=events.EVENTS_MAXLEN, approximate=True)


def check_replicated(
    task: Task | AsyncTask, acked: int | None, wanted: int, timeout: float
) -> None:
    """``NotReplicated`` if fewer than ``wanted`` replicas acknowledged (``acked``: what
    ``plan_submit`` returned)."""
    if acked is not None and acked < wanted:
        raise NotReplicated(task, acked, wanted, timeout)
