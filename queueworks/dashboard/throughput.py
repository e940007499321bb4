"""Subtask throughput over the last minutes, from samples the dashboard takes itself (and,
from the same samples, the per-minute history kept in Redis: ``history``).

Each sample reads ``done`` and ``dead`` of the active tasks (``qw:queue``) and of the tasks
the previous sample saw (so the last progress of a task that just finished is counted):
one pipelined round trip, whatever is in Redis. The rate is the growth of ``done + dead``
between samples, summed over tasks, so tasks that expire never make it go negative.

A sample's growth happened over the time since the one before, so it is spread over that
span, and a bucket's rate is what fell into it divided by the part of it the samples cover:
a steady rate reads the same in every bucket, at any phase of the clock. The series ends
with the bucket of the newest sample (a bucket no sample reached yet has nothing to say;
it used to read 0/s for the first seconds of every bucket).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any

from queueworks.dashboard.history import Minutes
from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.transport.connection import Connection


class Throughput:
    def __init__(self, *, window: float = 300.0, bucket: float = 10.0) -> None:
        self.window, self.bucket = window, bucket
        self._last: dict[str, int] = {}
        self._last_dead: dict[str, int] = {}
        self.minutes = Minutes()  # the per-minute history in Redis (``history``)
        self._last_at: float | None = None
        self._points: deque[tuple[float, float, int]] = deque()  # (since, at, settled)
        self._lock = threading.Lock()

    def sample(self, r: Connection, keys: Keys, now: float | None = None) -> int:
        """Take one sample; returns the subtasks settled since the previous one."""
        now = time.time() if now is None else now
        queued: Any = r.zrange(keys.queue, 0, -1)
        with self._lock:
            ids = sorted({text(t) for t in queued} | set(self._last))
            pipe = r.pipeline(transaction=False)
            for tid in ids:
                pipe.hmget(keys.task(tid).record, ["done", "dead", "created_at"])
            replies = pipe.execute()
            first = self._last_at is None
            since = self._last_at or now
            delta, died, seen, seen_dead = 0, 0, {}, {}
            for tid, (done, dead, created) in zip(ids, replies, strict=True):
                if created is None:  # expired: forget it
                    continue
                try:
                    gone, born = int(dead or 0), float(created)
                    value = int(done or 0) + gone
                except ValueError:  # a record no writer would store: not counted
                    continue
                if tid in self._last:
                    base, base_dead = self._last[tid], self._last_dead.get(tid, gone)
                elif first or born < since:
                    base, base_dead = value, gone  # made before we watched: not ours to count
                else:
                    base, base_dead = 0, 0
                delta += max(0, value - base)
                died += max(0, gone - base_dead)
                seen[tid], seen_dead[tid] = value, gone
            self._last, self._last_dead, self._last_at = seen, seen_dead, now
            self.minutes.add(r, keys, now, delta, died)
            if not first and now > since:
                self._points.append((since, now, delta))
            while self._points and self._points[0][1] < now - self.window - self.bucket:
                self._points.popleft()
            return delta

    def series(self, now: float | None = None) -> list[tuple[float, float]]:
        """``(bucket start, subtasks per second)`` for each bucket of the window, oldest
        first, up to the bucket of the newest sample (of ``now`` before the first); a
        bucket's rate is over the part of it the samples cover (0 where they cover none)."""
        now = time.time() if now is None else now
        with self._lock:
            points = list(self._points)
        n = int(self.window // self.bucket)
        end = points[-1][1] if points else now
        last = math.ceil(end / self.bucket) * self.bucket - self.bucket  # end's bucket
        start = last - (n - 1) * self.bucket
        sums, covered = [0.0] * n, [0.0] * n
        for since, at, delta in points:
            for i in range(max(0, int((since - start) // self.bucket)), n):
                low = start + i * self.bucket
                if low >= at:
                    break
                part = min(at, low + self.bucket) - max(since, low)
                if part > 0:
                    sums[i] += delta * part / (at - since)
                    covered[i] += part
        return [
            (start + i * self.bucket, sums[i] / covered[i] if covered[i] > 0 else 0.0)
            for i in range(n)
        ]
