"""A member's subtask retries that wait for their time (the task's ``retry_delay``,
``retry_backoff``, ``retry_max_delay``: ``queueworks.protocol.retry_policy``).

A failed subtask's next attempt is charged at once (``Attempts.retry``) and its entry stays
pending on this member; it waits here, off the member's path, while the member reads and
runs the task's other subtasks, and goes back in hand (``Run.held``, first) once due. While
it waits the member keeps it claimed (``XCLAIM ... JUSTID`` now and then: no attempt spent),
so the backstop that takes a wedged member's work never mistakes it for stuck. If the member
dies, the reclaim gives the entry to another member at once (charged, as any reclaimed
entry), without the wait; a member that leaves hands it back with the rest it holds.
"""

from __future__ import annotations

import heapq
import time
from typing import Any

from .loop import Run
from .work import Work, in_stream_order

REFRESH_SECONDS = 5.0  # keep the waiting entries claimed at least this often


class WaitingRetries:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.heap: list[tuple[float, int, Work]] = []  # (due at, seq, work)
        self.seq = 0
        self.every = min(REFRESH_SECONDS, run.spec.subtask_timeout / 2)
        self.refreshed_at = time.monotonic()

    def __len__(self) -> int:
        return len(self.heap)

    def add(self, work: Work, wait: float) -> None:
        """``work`` (charged: its next attempt) runs in ``wait`` seconds, not before."""
        if not self.heap:
            self.refreshed_at = time.monotonic()
        heapq.heappush(self.heap, (time.time() + wait, self.seq, work))
        self.seq += 1

    def seconds_left(self) -> float:
        """Until the first one is due (0 if one is; a long time if none waits)."""
        if not self.heap:
            return float("inf")
        return max(0.0, self.heap[0][0] - time.time())

    def tick(self) -> None:
        """Put the ones that are due in hand, first, in stream order (those still pending on
        this member: a fenced member handed them back); keep the others claimed (every
        ``every`` seconds)."""
        heap = self.heap
        if not heap:
            return
        now = time.time()
        due: list[Work] = []
        while heap and heap[0][0] <= now:
            due.append(heapq.heappop(heap)[2])
        if due:
            self.run.held.extendleft(reversed(in_stream_order(self._ours(due))))
        if heap and time.monotonic() - self.refreshed_at >= self.every:
            self._refresh()

    def _ours(self, works: list[Work]) -> list[Work]:
        """Those of ``works`` still pending on this member (one round trip)."""
        run = self.run
        streams = sorted({w.stream for w in works})
        pipe = run.r.pipeline(transaction=False)
        for stream in streams:
            ids = [w.entry_id for w in works if w.stream == stream]
            low, high = min(ids, key=_id_key), max(ids, key=_id_key)
            pipe.xpending_range(stream, run.tk.group, low, high, 10_000, consumername=run.me)
        ours = {
            (stream, _text(row["message_id"]))
            for stream, rows in zip(streams, pipe.execute(), strict=True)
            for row in rows
        }
        return [w for w in works if (w.stream, w.entry_id) in ours]

    def _refresh(self) -> None:
        """``XCLAIM JUSTID`` the waiting entries still pending on this member (no attempt
        spent; their idle time starts again). One that is no longer ours (handed back, or
        reclaimed while this member was presumed dead) leaves the wait: its taker runs it."""
        run = self.run
        self.refreshed_at = time.monotonic()
        kept = self._ours([w for _, _, w in self.heap])
        if len(kept) < len(self.heap):
            keep = {id(w) for w in kept}
            self.heap = [item for item in self.heap if id(item[2]) in keep]
            heapq.heapify(self.heap)
        pipe = run.r.pipeline(transaction=False)
        for stream in sorted({w.stream for w in kept}):
            ids: list[Any] = [w.entry_id for w in kept if w.stream == stream]
            pipe.xclaim(stream, run.tk.group, run.me, 0, ids, justid=True)
        pipe.execute()

    def clear(self) -> None:
        """The run ends: what waits is handed back with the rest the member holds."""
        self.heap = []


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
