"""Operator actions that the public ``Client`` does not offer: requeue or delete a dead letter.

Requeue keeps the accounting exact (``requeue_dead.lua``): the dead count goes down by one,
the subtask goes back on its task's stream with its index and payload, and a task that had
completed because ``done + dead == total`` becomes active again — state ``queued``, back in
the ``qw:queue`` zset, with a ``requeued`` event so the controller gives it nodes. A
cancelled or failed task is never reopened (resubmit it instead).

Delete discards the dead-letter record only: the subtask stays counted as dead.

A queue's dead job is requeued by ``requeue_job.lua``: its dead letter goes, ``dead`` goes down
by one, the job goes back on the queue's stream under its own id (its record says queued
again) and runs as a new first attempt. A queue that was cancelled takes no job back.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

from redis.commands.core import Script

from queueworks.client.sync import Client
from queueworks.errors import AdminError, TaskNotFound
from queueworks.protocol import events
from queueworks.protocol.jobrecords import DEAD_JOB, DEAD_PAYLOAD
from queueworks.protocol.keys import check_task_id
from queueworks.protocol.messages import partition_of, text
from queueworks.protocol.models import StoredSpec, TaskState
from queueworks.scripts.bound import ACTIVE, _source

_JOB_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # goes into a key: the hash tag must hold


@dataclass(frozen=True)
class Requeued:
    task_id: str
    dead_entry: str
    index: int
    new_entry: str
    stream: str
    reopened: bool


@dataclass(frozen=True)
class RequeuedJob:
    queue: str
    dead_entry: str
    job: str
    new_entry: str


class Admin:
    """Operator actions bound to one client (one script registration per instance)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._requeue: Script = client.redis.register_script(_source("requeue_dead"))

    def requeue_dead(self, task_id: str, entry_id: str) -> Requeued:
        """Put dead letter ``entry_id`` of ``task_id`` back on the task's stream."""
        r, keys = self.client.redis, self.client.keys
        tk = keys.task(check_task_id(task_id))
        raw: Any = r.hmget(tk.record, ["partitions", "state"])
        if raw[1] is None:
            raise TaskNotFound(task_id)
        partitions = int(raw[0] or 0)
        stream, key = tk.stream, ""
        if partitions > 0:
            entry: Any = r.xrange(tk.dead, entry_id, entry_id)
            if not entry:
                raise AdminError(f"dead letter {entry_id} of task {task_id}: missing entry")
            found = _ordering_key(text(entry[0][1].get(DEAD_PAYLOAD.encode())))
            if found is None:
                raise AdminError(
                    f"dead letter {entry_id} of task {task_id}: its payload has no 'key', "
                    "so its partition is unknown"
                )
            key = found
            stream = tk.partition(partition_of(key, partitions))
        mine = (tk.record, tk.dead, stream, tk.settled)
        others = [k for k in tk.all(partitions) if k not in mine]
        reply: Any = self._requeue(
            keys=[*mine, *others],
            args=[entry_id, tk.group, key, repr(time.time()), ACTIVE],
        )
        if int(reply[0]) != 1:
            raise AdminError(f"dead letter {entry_id} of task {task_id}: {text(reply[1])}")
        new_entry, reopened, created_at = text(reply[1]), bool(int(reply[2])), text(reply[3])
        index = int(reply[4])
        pipe = r.pipeline(transaction=False)
        if reopened:
            pipe.zadd(keys.queue, {task_id: float(created_at)})
        events.emit(
            pipe,
            keys,
            "requeued",
            task=task_id,
            entry=entry_id,
            index=index,
            reopened=int(reopened),
        )
        pipe.execute()
        return Requeued(task_id, entry_id, index, new_entry, stream, reopened)

    def requeue_job(self, queue: str, entry_id: str) -> RequeuedJob:
        """Put dead letter ``entry_id`` of queue ``queue`` back on its stream, as the same job."""
        r, keys = self.client.redis, self.client.keys
        tk = keys.task(check_task_id(queue))
        pipe = r.pipeline(transaction=False)
        pipe.hmget(tk.record, ["state", "spec"])
        pipe.xrange(tk.dead, entry_id, entry_id)
        (state, spec), found = pipe.execute()
        if state is None:
            raise TaskNotFound(queue)
        if not _is_queue(spec):
            raise AdminError(f"{queue} is a task, not a queue")
        if text(state) not in {s.value for s in TaskState}:
            raise AdminError(f"queue {queue}: its record's state {text(state)[:40]!r} is no state")
        if TaskState(text(state)).finished:
            raise AdminError(f"queue {queue} is {text(state)}: it takes no job back")
        if not found:
            raise AdminError(f"dead letter {entry_id} of queue {queue}: missing entry")
        job = text(found[0][1].get(DEAD_JOB.encode()) or b"")
        if not job:
            raise AdminError(f"dead letter {entry_id} of queue {queue}: it was no job (rejected)")
        if not _JOB_ID.match(job):
            raise AdminError(f"dead letter {entry_id} of queue {queue}: bad job id {job[:80]!r}")
        reply: Any = self.client.scripts.requeue_job(tk, entry_id, job, time.time())
        if int(reply[0]) != 1:
            raise AdminError(f"dead letter {entry_id} of queue {queue}: {text(reply[1])}")
        new_entry = text(reply[1])
        events.emit(r, keys, "requeued", task=queue, entry=entry_id, job=job)
        return RequeuedJob(queue, entry_id, job, new_entry)

    def requeue_dead_job(self, queue: str, job_id: str) -> RequeuedJob:
        """Requeue the dead job ``job_id`` of queue ``queue`` (its dead letter is looked for
        from the newest, a page a round trip); ``AdminError`` if it has none kept."""
        r, keys = self.client.redis, self.client.keys
        tk = keys.task(check_task_id(queue))
        end, wanted = "+", job_id.encode()
        while True:
            page: list[Any] = r.xrevrange(tk.dead, end, "-", count=LETTERS_PAGE) or []
            for entry_id, fields in page:
                if (fields or {}).get(DEAD_JOB.encode()) == wanted:
                    return self.requeue_job(queue, text(entry_id))
            if len(page) < LETTERS_PAGE:
                raise AdminError(f"job {job_id} of queue {queue}: no dead letter of it is kept")
            end = "(" + text(page[-1][0])

    def delete_dead(self, task_id: str, entry_id: str) -> bool:
        """Discard a dead-letter record (the subtask stays counted as dead)."""
        r, keys = self.client.redis, self.client.keys
        tk = keys.task(check_task_id(task_id))
        removed = int(r.xdel(tk.dead, entry_id))
        if removed:
            events.emit(r, keys, "dead_letter_deleted", task=task_id, entry=entry_id)
        return bool(removed)


LETTERS_PAGE = 1000  # dead letters a round trip of ``requeue_dead_job`` reads


def _is_queue(spec: Any) -> bool:
    try:
        return StoredSpec.model_validate_json(spec or b"").mode == "queue"
    except ValueError:
        return False


def _ordering_key(payload: str) -> str | None:
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    if isinstance(value, dict) and "key" in value:
        return str(value["key"])
    return None
