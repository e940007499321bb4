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

A call its worker stopped (``workers.stopping``: the job is no longer ours) that still runs
past the time it was given to end exits the process the same way.

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

EXIT_HUNG = 70  # EX_SOFTWARE: a handler ignored its timeout (or its stop); restart the worker
STOPPED_WATCH = 0.02  # s between two looks while a stopped call is awaited
_ident, _now = threading.get_ident, time.monotonic  # looked up once: called per subtask


class SubtaskTimeout(BaseException):
    """Raised inside a handler that ran past ``subtask_timeout``. A ``BaseException``, so a
    handler's ``except Exception`` does not swallow it."""


class TimedOut(Exception):
    """What the runtime records for an abandoned handler (a failed attempt)."""


# (thread ident, started, subtask index or job id, its timeout, its grace): the limits of
# the call's own task or queue, whatever ``use`` says later (a worker serves many queues)
Job = tuple[int, float, int | str, float, float]


class Slot:
    """One thread's armed call (the member's own thread has one; each pool thread its own:
    ``Watchdog.slot``)."""

    __slots__ = ("fired", "job")

    def __init__(self) -> None:
        self.job: Job | None = None
        self.fired: Job | None = None


class Watchdog(threading.Thread):
    """Watches the handler calls of one worker process against the ``subtask_timeout`` of
    the task it runs (``use``). One per process, started once: a task run starts no thread.
    Calls made on the member's own thread use its slot (``call``); a pool thread running
    handlers concurrently has a slot of its own (``slot`` and ``call_in``)."""

    def __init__(self, log: Any, *, timeout: float = 60.0, grace: float | None = None) -> None:
        super().__init__(name="qw-watchdog", daemon=True)
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._main = Slot()
        self._slots = [self._main]
        self.timeouts = 0
        self._stops: dict[int | str, float] = {}  # stopped calls' index -> their deadline
        self.calls = 0  # handler calls ended, in every slot
        self.call_limit: int | None = None  # then ``on_limit`` (``limit_calls``)
        self.on_limit: Callable[[], None] = _nothing
        self.use(timeout, log, grace=grace)

    def limit_calls(self, n: int, then: Callable[[], None]) -> None:
        """Call ``then`` as the ``n``-th handler call ends (a pool member's job limit:
        ``workers.retire``), on the thread that made it, before it may start another."""
        self.call_limit, self.on_limit = n, then

    def use(self, timeout: float, log: Any, *, grace: float | None = None) -> None:
        """The limits (and the logger) for the calls that follow: one task's."""
        self.timeout = timeout
        self.grace = grace if grace is not None else grace_for(timeout)
        self._log = log

    def slot(self) -> Slot:
        """A slot for another thread that calls handlers (kept for the process's life)."""
        slot = Slot()
        with self._lock:
            self._slots = [*self._slots, slot]
        return slot

    def call(self, index: int | str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the member's thread, under the deadline."""
        return self.call_in(self._main, index, fn, *args)

    def call_in(
        self,
        slot: Slot,
        index: int | str,
        fn: Callable[..., Any],
        *args: Any,
        timeout: float | None = None,
    ) -> Any:
        """``fn(*args)`` under the deadline (``timeout``: the call's own limit, else the
        one ``use`` set); raises ``TimedOut`` if it was abandoned.

        The timeout exception can land only while the deadline is armed; disarming clears
        one still pending, so it never escapes into the runtime's own code."""
        limit, grace = self.timeout, self.grace
        if timeout is not None:
            limit, grace = timeout, grace_for(timeout)
        job = slot.job = (_ident(), _now(), index, limit, grace)
        try:
            try:
                return fn(*args)
            finally:
                # Without the lock: once ``job`` is cleared the watchdog cannot fire on this
                # job any more; it may only be firing right now (it holds the lock) or have
                # fired already (``fired``), and then the pending exception is cleared.
                slot.job = None
                if job is slot.fired or self._lock.locked():
                    self._clear(slot, job)
                self.calls += 1
                if self.call_limit is not None and self.calls >= self.call_limit:
                    self.on_limit()
        except SubtaskTimeout:  # it may have landed inside the ``finally``: disarm again
            slot.job = None
            self._clear(slot, job)
            raise TimedOut(timed_out(index, job[3], "abandoned")) from None

    def current(self) -> int | str | None:
        """The subtask index (or job id) whose handler runs now, if any (the first found)."""
        for slot in self._slots:
            job = slot.job
            if job is not None:
                return job[2]
        return None

    def stopped(self, index: int | str, within: float) -> None:
        """The call of ``index`` (running now, or about to) was stopped: if it still runs
        ``within`` s from now, the process exits (``EXIT_HUNG``), as for a call past its
        hard limit. ``stop_ended`` once it has ended."""
        self._stops[index] = time.monotonic() + within

    def stop_ended(self, index: int | str) -> None:
        self._stops.pop(index, None)

    def _clear(self, slot: Slot, job: Job) -> None:
        with self._lock:
            if job is slot.fired:
                _raise_in(job[0], None)  # clear it if still pending

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.wait(self._interval()):
            for slot in self._slots:
                self._watch(slot)
                if self._stops:
                    self._watch_stopped(slot)

    def _interval(self) -> float:
        """How often to look: a quarter of the shortest limit in force (0.25 s at most;
        ``STOPPED_WATCH`` while a stopped call is awaited)."""
        running = [job[3] for slot in self._slots if (job := slot.job) is not None]
        most = STOPPED_WATCH if self._stops else 0.25
        return min(most, self.timeout / 4, *(t / 4 for t in running))

    def _watch_stopped(self, slot: Slot) -> None:
        """A stopped call still running past its deadline: the process exits."""
        job = slot.job
        deadline = self._stops.get(job[2]) if job is not None else None
        if job is None or deadline is None or time.monotonic() < deadline or slot.job is not job:
            return
        self._log.error("stopped_job_still_running", job=job[2], exit_code=EXIT_HUNG)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(EXIT_HUNG)

    def _watch(self, slot: Slot) -> None:
        job = slot.job
        if job is None:
            return
        _, started, index, timeout, grace = job
        overrun = time.monotonic() - started - timeout
        if overrun < 0:
            return
        if job is not slot.fired:
            with self._lock:
                if slot.job is job:
                    slot.fired = job
                    self.timeouts += 1
                    self._log.warning("subtask_timed_out", index=index, timeout=timeout)
                    _raise_in(job[0], SubtaskTimeout)
        elif overrun > grace and slot.job is job:
            self._log.error("subtask_hung", index=index, timeout=timeout, exit_code=EXIT_HUNG)
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(EXIT_HUNG)


def _nothing() -> None:
    return None


def grace_for(timeout: float) -> float:
    """How long past its timeout a handler that ignores it may go on before its worker
    gives up on it (the hard limit): the timeout itself, clamped to 1-30 s."""
    return min(max(timeout, 1.0), 30.0)


def timed_out(index: int | str, timeout: float, how: str) -> str:
    """What a failed attempt says when its handler ran past its limit."""
    what, limit = (
        (f"job {index}", "job_timeout")
        if isinstance(index, str)
        else (f"subtask {index}", "subtask_timeout")
    )
    return f"{what} timed out: it ran past {limit} ({timeout} s) and was {how}"


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Schedule ``exc`` in thread ``thread_id`` (None: clear a pending one)."""
    obj = ctypes.py_object(exc) if exc is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), obj)
