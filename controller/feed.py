"""The events stream as the controller reads it: what each event names for the next pass.

``XREAD BLOCK`` after the last id read; each event names the task and/or worker to read
again (``NAMES``), events this controller wrote itself (field ``by``) name nothing, and an
event of a kind not listed names whatever its ``task`` and ``worker`` fields say.

Two kinds are kept apart, because the pass can often act on them without a read: a task that
ended (``completed``, ``failed``, ``cancelled``: released at once, the release itself
checking that it did end; a queue is read first, for the wait lists that expire with it),
and a member that left (``member_left``: nothing to read if the pass already released that
task).

A gap: the stream is capped (``EVENTS_MAXLEN``, trimmed from the head), so a reader that
fell behind by more than that — frozen, partitioned, or just slow — finds that the stream's
first entry is newer than the last id it read. What it missed is unknown: it must do a full
pass. The read of the stream's first entry rides in the same pipeline as the ``XREAD``
(Redis runs it once the blocked read returns): no round trip of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.transport.connection import Connection

from .tally import Tally

# kind -> (read the task again, read the worker again, read the task's refusals too)
NAMES: dict[str, tuple[bool, bool, bool]] = {
    "submitted": (True, False, True),
    "changed": (True, False, False),
    "demand": (False, False, False),  # a queue's want (older workers): no longer read
    "memberships": (False, True, False),  # the queues a worker is a member of changed
    "handlers": (True, False, True),  # a queue's handlers changed (one named, set aside...)
    "reopened": (True, False, True),  # a finished queue opened again
    "cancelled": (True, False, False),
    "completed": (True, False, False),
    "failed": (True, False, False),
    "requeued": (True, False, False),
    "released": (True, False, False),
    "running": (True, False, False),
    "waiting": (True, False, False),
    "refused": (True, True, True),
    "worker_joined": (False, True, False),
    "worker_left": (False, True, False),
    "worker_lost": (False, True, False),
    "member_lost": (True, True, False),
    "assigned": (False, True, False),
    "unassigned": (False, True, False),
    "leader": (False, False, False),
    "drain_requested": (False, False, False),
    "dead_lettered": (False, False, False),
    "dead_letter_deleted": (False, False, False),
    "schedules": (False, False, False),  # a queue's schedule written: the scheduler looks
}
DEFAULT = (True, True, False)
ENDED = ("completed", "failed", "cancelled")
READ_COUNT = 5000  # events per XREAD


class Gap(Exception):
    """Events may have been trimmed unread: only a full read is sound now."""


@dataclass
class Dirty:
    """What a pass must read again."""

    tasks: set[str] = field(default_factory=set)
    deep: set[str] = field(default_factory=set)  # tasks whose refusals to read too
    workers: set[str] = field(default_factory=set)
    ended: dict[str, str] = field(default_factory=dict)  # task -> how it ended (event kind)
    left: dict[str, str] = field(default_factory=dict)  # worker -> task it left
    events: int = 0  # events read (own ones included)
    gap: bool = False  # events may have been trimmed before they were read
    schedules: bool = False  # a schedule was written (``controller.scheduler``)

    def __bool__(self) -> bool:
        return bool(self.tasks or self.workers or self.ended or self.left)


def classify(entries: Iterable[tuple[Any, dict[bytes, bytes]]], me: str) -> Dirty:
    dirty = Dirty()
    mine = me.encode()
    for _, fields in entries:
        dirty.events += 1
        if fields.get(b"by") == mine:
            continue
        kind = text(fields.get(b"kind"))
        if kind == "schedules":
            dirty.schedules = True
            continue
        task, worker = fields.get(b"task"), fields.get(b"worker")
        if kind in ENDED and task:
            dirty.ended[text(task)] = kind
            continue
        if kind == "member_left" and task and worker:
            dirty.left[text(worker)] = text(task)
            continue
        task_too, worker_too, deep = NAMES.get(kind, DEFAULT)
        if task_too and task:
            dirty.tasks.add(text(task))
            if deep:
                dirty.deep.add(text(task))
        if worker_too and worker:
            dirty.workers.add(text(worker))
    return dirty


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class Feed:
    """The controller's position in the events stream."""

    def __init__(self, r: Connection, keys: Keys, me: str, tally: Tally) -> None:
        self.r, self.keys, self.me, self.tally = r, keys, me, tally
        self.last = "0-0"

    def start(self) -> None:
        """Read only what comes next (a full read of the state follows)."""
        self.tally.commands += 1
        last: Any = self.r.xrevrange(self.keys.events, count=1)
        self.last = last[0][0].decode() if last else "0-0"

    def read(self, block_ms: int) -> Dirty:
        """Wait up to ``block_ms`` (0: do not wait) for events after the last read."""
        before = self.last
        pipe = self.r.pipeline(transaction=False)
        pipe.xread({self.keys.events: before}, count=READ_COUNT, block=block_ms or None)
        pipe.xrange(self.keys.events, count=1)
        reply, head = self.tally.run(pipe)
        dirty = Dirty()
        if reply:
            entries = reply[0][1]
            self.last = entries[-1][0].decode()
            dirty = classify(entries, self.me)
        dirty.gap = gapped(before, head)
        return dirty


def gapped(before: str, head: Any) -> bool:
    """True if entries after ``before`` may have been trimmed unread: the stream's first
    entry (read after the events were) is newer than ``before``."""
    if before == "0-0" or not head:
        return False
    return _id(text(head[0][0])) > _id(before)
