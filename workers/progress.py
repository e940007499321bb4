"""Where a queue's jobs' progress goes (``ctx.progress``): one ``ProgressWriter`` per queue a
member serves, shared by the contexts of its jobs.

A report is one script call (``job_progress.lua``: HSET, and EXPIRE for a partial record)
on the worker's connection, from the thread that calls it (the handler's, or the event
loop's); the context coalesces reports to one every ``context.PROGRESS_SECONDS`` and
writes the last one when the call ends, before the job's settle. A job that never reports
costs nothing here. Progress is advisory: a write that fails is logged, never the job's
failure.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from queueworks.context import Report
from queueworks.keys import TaskKeys
from queueworks.scripts import Scripts


class ProgressWriter:
    def __init__(self, scripts: Scripts, tk: TaskKeys, ttl: int, log: Any) -> None:
        self.scripts, self.tk, self.ttl, self.log = scripts, tk, ttl, log

    def write(self, job_id: str, named: bool, report: Report) -> None:
        try:
            self.scripts.job_progress(self.tk, job_id, named, report, self.ttl)
        except RedisError as exc:
            self.log.warning("progress_not_written", job=job_id, error=repr(exc))
