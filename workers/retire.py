"""A pool member's limits: after ``--max-jobs-per-child`` jobs, or once its memory passes
``--max-memory-per-child``, it retires (``Worker.retire``: it finishes what runs, hands back
what it read, leaves and exits 0) and its supervisor (``workers.pool``) starts a fresh one.

The job limit is the watchdog's (``Watchdog.limit_calls``): the worker retires as its N-th
handler call ends, before it starts another; ``async def`` handlers, which the watchdog does
not see, are counted by a thread that looks at the settled count (``NodeState.processed``)
a few times a second. Memory is read by that thread only after the count moved (a job
ended), as Celery does after each task, so a limit below what an idle process takes
retires a member after each job, never in a loop of starts.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from collections.abc import Callable
from typing import Any

from .heartbeat import NodeState
from .watchdog import Watchdog

LOOK_EVERY = 0.05  # s between two looks at the count


def rss_bytes() -> int:
    """This process's resident memory now (Linux); elsewhere its peak."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)


class Retirement(threading.Thread):
    def __init__(
        self,
        state: NodeState,
        watchdog: Watchdog,
        retire: Callable[[], None],
        log: Any,
        *,
        max_jobs: int | None = None,
        max_memory_mb: int | None = None,
    ) -> None:
        super().__init__(name="qw-retire", daemon=True)
        self.state, self.watchdog, self._retire, self.log = state, watchdog, retire, log
        self.max_jobs, self.max_memory_mb = max_jobs, max_memory_mb
        self.why = ""  # set once it retired the worker
        self._lock = threading.Lock()
        if max_jobs is not None:
            watchdog.limit_calls(max_jobs, self._calls_done)

    def _calls_done(self) -> None:
        self.now(f"ran {self.watchdog.calls} jobs (max_jobs_per_child={self.max_jobs})")

    def now(self, why: str) -> None:
        """Retire, saying why (once)."""
        with self._lock:
            if self.why:
                return
            self.why = why
        self.log.info("worker_retiring", why=why, processed=self.state.processed)
        self._retire()

    def run(self) -> None:
        seen = 0
        halt = threading.Event()
        while not self.state.stopping and not halt.wait(LOOK_EVERY):
            done = self.state.processed
            if done == seen:
                continue
            seen = done
            why = self.over(done)
            if why:
                self.now(why)
                return

    def over(self, done: int) -> str:
        """Why the worker must retire now, having settled ``done`` items ("" if not)."""
        if self.max_jobs is not None and done >= self.max_jobs:
            return f"ran {done} jobs (max_jobs_per_child={self.max_jobs})"
        if self.max_memory_mb is not None:
            mb = rss_bytes() / 2**20
            if mb > self.max_memory_mb:
                return f"uses {mb:.0f} MB (max_memory_per_child={self.max_memory_mb})"
        return ""
