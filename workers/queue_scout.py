"""Which queues a worker serves: every active queue whose node selector its labels match,
whose jobs' handlers its ``--allow`` prefixes cover (one of them is enough; a queue whose
jobs name none yet, any), and, when it was started with ``--queues``, one of those.

What it costs does not grow with the number of queues while nothing changes: the scout reads
every queue (the names in ``qw:queues``, each queue's state, spec and handlers, in one
pipeline; a spec never changes, so it is parsed once) only at its first look and when the
events stream was trimmed before it read it. Each look reads the events that came since the
last (one ``XREAD``, a few more after a burst: a worker that dies leaves an event in each of
its queues) and reads again only the queues they name: created, reopened, a new handler,
cancelled or finished, paused, resumed or reconfigured. Those last three are also said to the
worker's queue loop (``touched``), which then checks those queues at once.

The backstop, should an event be missed: each look also reads a few queues more, in turn,
so that every queue is read again each ``FULL_SECONDS`` (with many queues less often:
``FULL_READS_PER_SECOND`` queues a second), a round taking the names in ``qw:queues`` as
they are when it begins. A few each look, never all at once: with thousands of queues, a
read of them all is thousands of commands in one burst, every worker's at about the same
time when they started together.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from queueworks.protocol.allow import covers
from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.protocol.models import ACTIVE_STATES, StoredSpec
from queueworks.transport.connection import Connection

ACTIVE = frozenset(s.value for s in ACTIVE_STATES)
FULL_SECONDS = 30.0  # every queue is read again this often (a backstop for the events) ...
FULL_READS_PER_SECOND = 50.0  # ... or less often with many: this many queues a second
LAG_SECONDS = 1.0  # the backstop held up longer (a slow loop) reads no more than this much

EVENTS_COUNT = 1000  # events read per page ...
EVENTS_PAGES = 50  # ... and per look, at most this many pages (more: a full read)
# events that may change whether a worker serves a queue ...
SCOUTED = frozenset({"submitted", "reopened", "handlers", "cancelled", "completed", "failed"})
# ... and those that change how a member serves it (its next check reads them)
TOUCHED = frozenset({"paused", "resumed", "changed", "emptied"})


def may_serve(
    spec: StoredSpec,
    handlers: Collection[str],
    *,
    labels: Mapping[str, str],
    allow: Sequence[str],
) -> bool:
    """True if a worker with ``labels`` and ``allow`` prefixes may serve the queue."""
    if any(labels.get(k) != v for k, v in spec.node_selector.items()):
        return False
    return not handlers or any(covers(allow, h) for h in handlers)


class Scout:
    def __init__(
        self,
        r: Connection,
        keys: Keys,
        *,
        labels: Mapping[str, str],
        allow: Sequence[str],
        only: Collection[str] | None = None,
    ) -> None:
        self.r, self.keys = r, keys
        self.labels, self.allow = dict(labels), list(allow)
        self.only = frozenset(only) if only else None  # --queues
        self.specs: dict[str, StoredSpec | None] = {}  # parsed once (None: not a queue)
        self.serves: set[str] = set()  # the queues we may serve, as last read
        self.cursor: str | None = None  # the last event read (None: read everything next)
        self.touched: set[str] = set()  # queues paused, resumed or changed since last asked
        self.changes = 0  # bumped whenever ``serves`` changes
        self.names: list[str] = []  # the backstop's round: every queue, as it began
        self.turn = 0  # ... the next one it reads
        self.turn_at = 0.0  # ... and when the queues before it were due (monotonic)

    def eligible(self, now: float | None = None) -> set[str]:
        """The queues this worker may serve now (``now``: monotonic), by name (``changes``
        says whether that differs from the last call's)."""
        now = time.monotonic() if now is None else now
        if self.cursor is None:
            return self._full(now)
        pipe = self.r.pipeline(transaction=False)
        pipe.xread({self.keys.events: self.cursor}, count=EVENTS_COUNT)
        pipe.xrange(self.keys.events, count=1)
        reply, head = pipe.execute()
        entries = reply[0][1] if reply else []
        if _gapped(self.cursor, head):
            return self._full(now)  # (events may have been missed)
        pages = 1
        while len(entries) >= EVENTS_COUNT * pages:  # a burst (a worker left 10,000 queues)
            if pages >= EVENTS_PAGES:
                return self._full(now)
            more: Any = self.r.xread({self.keys.events: text(entries[-1][0])}, count=EVENTS_COUNT)
            entries += more[0][1] if more else []
            pages += 1
        names: set[str] = set()
        for entry_id, fields in entries:
            self.cursor = text(entry_id)
            kind, task = text(fields.get(b"kind", b"")), fields.get(b"task")
            if task is None or (self.only is not None and text(task) not in self.only):
                continue
            if kind in SCOUTED:
                names.add(text(task))
            elif kind in TOUCHED:
                self.touched.add(text(task))
        names |= set(self._turn(now))
        if names:
            found = self._read(sorted(names))
            self._serve((self.serves - names) | set(found))
        return self.serves

    def take_touched(self) -> set[str]:
        """The queues paused, resumed or changed since the last call."""
        touched, self.touched = self.touched, set()
        return touched

    def _full(self, now: float) -> set[str]:
        """Read every queue (from the events that follow, only what they name; the
        backstop's next round begins after a ``FULL_SECONDS``)."""
        last: Any = self.r.xrevrange(self.keys.events, count=1)
        self.cursor = text(last[0][0]) if last else "0-0"
        names = self._names()
        self._serve(set(self._read(names)))
        self.names, self.turn = names, len(names)  # (the next round: once they are due again)
        self.turn_at = now + max(FULL_SECONDS, len(names) / FULL_READS_PER_SECOND)
        return self.serves

    def _names(self) -> list[str]:
        """Every queue (``qw:queues``; of ``--queues``, if given), by name."""
        names = sorted(text(n) for n in self.r.smembers(self.keys.queues))
        if self.only is not None:
            names = [n for n in names if n in self.only]
        return names

    def _serve(self, names: set[str]) -> None:
        if names != self.serves:
            self.serves, self.changes = names, self.changes + 1

    def _turn(self, now: float) -> list[str]:
        """The backstop's queues due by ``now``: in turn, every one each ``FULL_SECONDS``
        (with many, ``FULL_READS_PER_SECOND`` a second). Each round begins with the names as
        they are then (a queue no longer there is served no more)."""
        if self.turn >= len(self.names):  # the round ended: the next one, when it is due
            if now < self.turn_at:
                return []
            self.names, self.turn = self._names(), 0
            self._serve(self.serves & set(self.names))
            if not self.names:
                self.turn_at = now + FULL_SECONDS
                return []
        n = len(self.names)
        period = max(FULL_SECONDS, n / FULL_READS_PER_SECOND)
        self.turn_at = max(self.turn_at, now - LAG_SECONDS)  # (held up: no catching up at once)
        due = min(n - self.turn, math.floor((now - self.turn_at) * n / period))
        if due <= 0:
            return []
        self.turn_at += due * period / n
        self.turn += due
        return self.names[self.turn - due : self.turn]

    def _read(self, names: list[str]) -> list[str]:
        """Of ``names``, the queues this worker may serve now (their records read)."""
        if not names:
            return []
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            tk = self.keys.task(name)
            pipe.hmget(tk.record, ["state", "spec"])
            pipe.smembers(tk.handlers)
        replies = pipe.execute()
        out = []
        for k, name in enumerate(names):
            (state, raw), handlers = replies[2 * k], replies[2 * k + 1]
            if text(state) not in ACTIVE:
                continue
            spec = self._spec(name, raw)
            if spec is None:
                continue
            found = [text(h) for h in handlers]
            if may_serve(spec, found, labels=self.labels, allow=self.allow):
                out.append(name)
        return out

    def _spec(self, name: str, raw: Any) -> StoredSpec | None:
        if name in self.specs:
            return self.specs[name]
        spec = None
        if raw is not None:
            try:
                spec = StoredSpec.model_validate_json(raw)
            except ValidationError:
                spec = None  # the run says why, if it ever joins
        if spec is not None and spec.mode != "queue":
            spec = None
        if raw is not None:
            self.specs[name] = spec
        return spec


def _gapped(before: str, head: Any) -> bool:
    """True if events after ``before`` may have been trimmed unread (the stream's first
    entry is newer than it)."""
    if before == "0-0" or not head:
        return False
    return _id(text(head[0][0])) > _id(before)


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
