"""Subtask throughput over the last minutes, from samples the dashboard takes itself.

Each sample reads ``done`` and ``dead`` of the active tasks (``qw:queue``) and of the tasks
the previous sample saw (so the last progress of a task that just finished is counted):
one pipelined round trip, whatever is in Redis. The rate is the growth of ``done + dead``
between samples, summed over tasks, so tasks that expire never make it go negative.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from queueworks.connection import Connection, text
from queueworks.keys import Keys


class Throughput:
    def __init__(self, *, window: float = 300.0, bucket: float = 10.0) -> None:
        self.window, self.bucket = window, bucket
        self._last: dict[str, int] = {}
        self._last_at: float | None = None
        self._points: deque[tuple[float, int]] = deque()
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
            delta, seen = 0, {}
            for tid, (done, dead, created) in zip(ids, replies, strict=True):
                if created is None:  # expired: forget it
                    continue
                try:
                    value, born = int(done or 0) + int(dead or 0), float(created)
                except ValueError:  # a record no writer would store: not counted
                    continue
                if tid in self._last:
                    base = self._last[tid]
                elif first or born < since:
                    base = value  # progress made before we watched: not ours to count
                else:
                    base = 0
                delta += max(0, value - base)
                seen[tid] = value
            self._last, self._last_at = seen, now
            if not first:
                self._points.append((now, delta))
            while self._points and self._points[0][0] < now - self.window:
                self._points.popleft()
            return delta

    def series(self, now: float | None = None) -> list[tuple[float, float]]:
        """``(bucket start, subtasks per second)`` for each bucket of the window, oldest
        first; empty buckets are 0, and the current bucket's rate is over its time so far."""
        now = time.time() if now is None else now
        n = int(self.window // self.bucket)
        start = (now // self.bucket) * self.bucket - (n - 1) * self.bucket
        sums = [0] * n
        with self._lock:
            points = list(self._points)
        for t, d in points:
            i = int((t - start) // self.bucket)
            if 0 <= i < n:
                sums[i] += d
        spans = [self.bucket] * n
        spans[-1] = min(self.bucket, max(1.0, now - (start + (n - 1) * self.bucket)))
        return [(start + i * self.bucket, sums[i] / spans[i]) for i in range(n)]
