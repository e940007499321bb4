"""The handler watchdog: a handler that runs past ``subtask_timeout`` is abandoned.

Soft limit (at ``subtask_timeout``): ``SubtaskTimeout`` is raised inside the handler's thread
(``PyThreadState_SetAsyncExc``, as rq's ``TimerDeathPenalty`` does); the runtime counts it as
a failed attempt and goes on, the worker stays in its node set. Python code is interrupted at
its next bytecode (a ``time.sleep`` when it returns).

Hard limit (``grace`` later): a handler stuck in C code never sees the exception; the worker
process exits (``EXIT_HUNG``) so its supervisor (docker ``restart:``, systemd) starts a fresh
one. Its heartbeat stops, the others prune it and reclaim what it held; each start of a
reclaimed entry is charged, so a handler that hangs every time is dead-lettered after
``max_attempts`` starts.

Arming is one attribute write and disarming another, plus a look at the lock: the watchdog
thread checks a few times a second and costs the hot path nothing else.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

EXIT_HUNG = 70  # EX_SOFTWARE: a handler ignored its timeout; restart the worker
_ident, _now = threading.get_ident, time.monotonic  # looked up once: called per subtask


class SubtaskTimeout(BaseException):
    """Raised inside a handler that ran past ``subtask_timeout``. A ``BaseException``, so a
    handler's ``except Exception`` does not swallow it."""


class TimedOut(Exception):
    """What the runtime records for an abandoned handler (a failed attempt)."""


class Watchdog(threading.Thread):
    """Watches the handler calls of one worker process against the ``subtask_timeout`` of
    the task it runs (``use``). One per process, started once: a task run starts no thread."""

    def __init__(self, log: Any, *, timeout: float = 60.0, grace: float | None = None) -> None:
        super().__init__(name="qw-watchdog", daemon=True)
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._job: tuple[int, float, int | str] | None = None  # (thread ident, started, what)
        self._fired: tuple[int, float, int | str] | None = None
        self.timeouts = 0
        self.use(timeout, log, grace=grace)

    def use(self, timeout: float, log: Any, *, grace: float | None = None) -> None:
        """The limits (and the logger) for the calls that follow: one task's."""
        self.timeout = timeout
        self.grace = grace if grace is not None else min(max(timeout, 1.0), 30.0)
        self._log = log

    def call(self, index: int | str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` under the deadline; raises ``TimedOut`` if it was abandoned.

        The timeout exception can land only while the deadline is armed; disarming clears
        one still pending, so it never escapes into the runtime's own code."""
        job = self._job = (_ident(), _now(), index)
        try:
            try:
                return fn(*args)
            finally:
                # Without the lock: once ``_job`` is cleared the watchdog cannot fire on this
                # job any more; it may only be firing right now (it holds the lock) or have
                # fired already (``_fired``), and then the pending exception is cleared.
                self._job = None
                if job is self._fired or self._lock.locked():
                    self._clear(job)
        except SubtaskTimeout:  # it may have landed inside the ``finally``: disarm again
            self._job = None
            self._clear(job)
            what, limit = (
                (f"job {index}", "job_timeout")
                if isinstance(index, str)
                else (f"subtask {index}", "subtask_timeout")
            )
            raise TimedOut(
                f"{what} timed out: it ran past {limit} ({self.timeout} s) and was abandoned"
            ) from None

    def current(self) -> int | str | None:
        """The subtask index (or job id) whose handler runs now, if any."""
        job = self._job
        return None if job is None else job[2]

    def _clear(self, job: tuple[int, float, int | str]) -> None:
        with self._lock:
            if job is self._fired:
                _raise_in(job[0], None)  # clear it if still pending

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.wait(min(0.25, self.timeout / 4)):
            job = self._job
            if job is None:
                continue
            overrun = time.monotonic() - job[1] - self.timeout
            if overrun < 0:
                continue
            if job is not self._fired:
                with self._lock:
                    if self._job is job:
                        self._fired = job
                        self.timeouts += 1
                        self._log.warning("subtask_timed_out", index=job[2], timeout=self.timeout)
                        _raise_in(job[0], SubtaskTimeout)
            elif overrun > self.grace and self._job is job:
                self._log.error(
                    "subtask_hung", index=job[2], timeout=self.timeout, exit_code=EXIT_HUNG
                )
                sys.stderr.flush()
                sys.stdout.flush()
                os._exit(EXIT_HUNG)


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Schedule ``exc`` in thread ``thread_id`` (None: clear a pending one)."""
    obj = ctypes.py_object(exc) if exc is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), obj)
