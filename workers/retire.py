"""A pool member's limits: after ``--max-jobs-per-child`` jobs, or once its memory passes
``--max-memory-per-child``, it retires (``Worker.retire``: it finishes what runs, hands back
what it read, leaves and exits 0) and its supervisor (``workers.pool``) starts a fresh one.

Both are looked at as a handler call ends, before the worker starts another
(``Watchdog.limit_calls``: nothing is added to a call unless a limit is set; memory, when
limited, is read after each call, as Celery does after each task). So a memory limit below
what an idle process takes retires a member after each job, never in a loop of starts.
``async def`` handlers, which the watchdog does not see, are counted by a thread that looks
at the settled count (``NodeState.processed``) a few times a second.
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
        self._arm()

    def _arm(self) -> None:
        """Have the watchdog call us when the next look is due: after the last job allowed,
        or after the next one if memory is limited."""
        due = [] if self.max_jobs is None else [self.max_jobs]
        if self.max_memory_mb is not None:
            due.append(self.watchdog.calls + 1)
        if due:
            self.watchdog.limit_calls(min(due), self._call_ended)

    def _call_ended(self) -> None:
        why = self.over(self.watchdog.calls)
        if why:
            self.now(why)
        else:
            self._arm()

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
