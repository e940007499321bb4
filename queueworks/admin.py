"""Operator actions that the public ``Client`` does not offer: requeue or delete a dead letter.

Requeue keeps the accounting exact (``requeue_dead.lua``): the dead count goes down by one,
the subtask goes back on its task's stream with its index and payload, and a task that had
completed because ``done + dead == total`` becomes active again — state ``queued``, back in
the ``qw:queue`` zset, with a ``requeued`` event so the controller gives it nodes. A
cancelled or failed task is never reopened (resubmit it instead).

Delete discards the dead-letter record only: the subtask stays counted as dead.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from redis.commands.core import Script

from queueworks import events
from queueworks.client import Client, TaskNotFound
from queueworks.connection import text
from queueworks.keys import check_task_id
from queueworks.messages import partition_of
from queueworks.scripts import ACTIVE, _source


class AdminError(ValueError):
    """An operator action that cannot be done; the message says why."""


@dataclass(frozen=True)
class Requeued:
    task_id: str
    dead_entry: str
    index: int
    new_entry: str
    stream: str
    reopened: bool


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
            found = _ordering_key(text(entry[0][1].get(b"payload")))
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

    def delete_dead(self, task_id: str, entry_id: str) -> bool:
        """Discard a dead-letter record (the subtask stays counted as dead)."""
        r, keys = self.client.redis, self.client.keys
        tk = keys.task(check_task_id(task_id))
        removed = int(r.xdel(tk.dead, entry_id))
        if removed:
            events.emit(r, keys, "dead_letter_deleted", task=task_id, entry=entry_id)
        return bool(removed)


def _ordering_key(payload: str) -> str | None:
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    if isinstance(value, dict) and "key" in value:
        return str(value["key"])
    return None
