"""Where a queue's jobs' progress goes (``ctx.progress``): one ``ProgressWriter`` per queue a
member serves, shared by the contexts of its jobs.

A report is one script call (``job_progress.lua``: HSET, and EXPIRE for a partial record)
on the worker's connection. A job's first report is written at once, from the thread
that makes it (the handler's, or the event loop's); one within ``PROGRESS_SECONDS`` of
the last write waits, replaced by any later one, and is written by the writer's flusher
thread once that time is up, or when the call ends (before the job's settle), whichever
comes first. Writes go out one at a time, under the writer's lock, so a job's reports
land in order. The flusher runs only while reports wait (it stops after
``FLUSHER_IDLE`` s without one). A job that never reports costs nothing here. Progress is
advisory: a write that fails is logged, never the job's failure.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from redis.exceptions import RedisError

from queueworks.context import PROGRESS_SECONDS, Report
from queueworks.protocol.keys import TaskKeys
from queueworks.scripts.bound import Scripts

FLUSHER_IDLE = 1.0  # s the flusher waits with nothing to write before it stops


class Reports:
    """One job's reports on this worker: when the last one was written, the one that
    waits (None: none), and whether its call ended."""

    __slots__ = ("job_id", "named", "over", "sent_at", "waiting")

    def __init__(self, job_id: str, named: bool) -> None:
        self.job_id, self.named = job_id, named
        self.sent_at = -math.inf
        self.waiting: Report | None = None
        self.over = False


class ProgressWriter:
    def __init__(self, scripts: Scripts, tk: TaskKeys, ttl: int, log: Any) -> None:
        self.scripts, self.tk, self.ttl, self.log = scripts, tk, ttl, log
        self._lock = threading.Lock()
        self._due = threading.Condition(self._lock)
        self._waiting: dict[int, Reports] = {}  # jobs with a report to write, by id()
        self._flusher: threading.Thread | None = None

    def start(self, job_id: str, named: bool) -> Reports:
        return Reports(job_id, named)

    def report(self, job: Reports, report: Report) -> None:
        with self._lock:
            if job.over:
                return
            now = time.monotonic()
            if now - job.sent_at >= PROGRESS_SECONDS:
                job.waiting = None
                self._waiting.pop(id(job), None)
                self._send(job, report, now)
                return
            job.waiting = report
            if id(job) not in self._waiting:
                self._waiting[id(job)] = job
                self._wake_flusher()

    def end(self, job: Reports) -> None:
        with self._lock:
            job.over = True
            self._waiting.pop(id(job), None)
            if job.waiting is not None:
                self._send(job, job.waiting, time.monotonic())
                job.waiting = None

    def _send(self, job: Reports, report: Report, now: float) -> None:
        """Write ``report`` (the lock held: writes in order)."""
        job.sent_at = now
        try:
            self.scripts.job_progress(self.tk, job.job_id, job.named, report, self.ttl)
        except RedisError as exc:
            self.log.warning(
                "progress_not_written",
                job=job.job_id,
                job_id=job.job_id,
                queue=self.tk.task_id,
                error=repr(exc),
            )

    def _wake_flusher(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush, name="qw-progress", daemon=True)
            self._flusher.start()
        else:
            self._due.notify()

    def _flush(self) -> None:
        """The flusher: write each waiting report once its job's interval is up."""
        with self._lock:
            idle_since = time.monotonic()
            while True:
                now = time.monotonic()
                if not self._waiting:
                    if now - idle_since >= FLUSHER_IDLE:
                        self._flusher = None
                        return
                    self._due.wait(FLUSHER_IDLE)
                    continue
                idle_since = now
                next_at = math.inf
                for key, job in list(self._waiting.items()):
                    at = job.sent_at + PROGRESS_SECONDS
                    if at > now:
                        next_at = min(next_at, at)
                        continue
                    del self._waiting[key]
                    if job.waiting is not None:
                        self._send(job, job.waiting, now)
                        job.waiting = None
                if next_at < math.inf:
                    self._due.wait(max(0.001, next_at - time.monotonic()))
