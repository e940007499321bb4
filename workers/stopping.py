"""Stopping a job while it runs: the one way a worker ends a handler call it no longer wants
finished (``Running.stop``), whatever the reason (``queueworks.context.Stopped``: its worker
was fenced). A stopped job is no longer this worker's: nothing of it is settled (no ack, no
result, no group slot or unique key given back); its outcome, when its call ends, is dropped.

A job cancelled while it ran (``queueworks.queue.job_stops``: ``Cancelled``) is stopped the same
way, its cancel having settled it already; but a plain handler that does not stop is left
to finish (its outcome dropped) unless ``cancel_ends_process``.

How a call is stopped depends on what it can hear:

* an ``async def`` handler's coroutine is cancelled at once (its call ends with the reason);
* a plain handler that takes a context raises the reason at its next ``ctx.checkpoint()``
  (a ``BaseException``: its ``except Exception`` lets it through); one still running
  ``STOP_GRACE`` s later, or one that takes no context (it cannot be asked), is past
  saving: the watchdog ends the process (``EXIT_HUNG``), for its supervisor to start a fresh
  one, as for a handler past its hard timeout.

The jobs are registered by the queue loop while their calls run (``started``, ``ended``); a
fence stops those of the membership it was found in that run elsewhere now (``fenced``: what
``Seat.fence`` calls).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from redis.exceptions import ResponseError

from queueworks.context import Cancelled, Fenced, Stopped
from queueworks.protocol.keys import GROUP
from queueworks.protocol.messages import text
from queueworks.transport.connection import Connection

from .eventloop import EventLoop
from .heartbeat import Seat
from .inflight import is_async
from .running_job import RunningJob
from .watchdog import Watchdog

STOP_GRACE = 1.0  # s a stopped plain handler with a context has to reach its checkpoint
CANCELLED_KEPT = 1000  # jobs cancelled before they started here that a worker remembers
CANCELLED_SECONDS = 600.0  # ... and for how long (one read is started well before that)


class Running:
    """The queues' jobs whose handler calls run on this worker now, by the membership (seat)
    they run in; any thread may stop them (the heartbeat's, finding a fence)."""

    def __init__(
        self, r: Connection, me: str, aio: EventLoop, watchdog: Watchdog, log: Any
    ) -> None:
        self.r, self.me = r, me
        self.aio, self.watchdog, self.log = aio, watchdog, log
        self._lock = threading.Lock()
        self._jobs: dict[int, tuple[str, RunningJob]] = {}  # id(job) -> (seat's key, job)
        self.cancel_ends_process = False  # a cancelled plain handler that runs on: exit
        self._cancelled: dict[tuple[str, str], float] = {}  # cancelled, not started: when

    def started(self, seat: Seat, job: RunningJob) -> None:
        """``job``'s call is about to start in ``seat``'s membership; stopped at once if
        that is fenced already (a fence found meanwhile finds the job registered)."""
        with self._lock:
            self._jobs[id(job)] = (seat.key, job)
        if seat.fenced:
            self.stop(job, fenced())
        if self._cancelled and self._was_cancelled(seat.key, job.entry.job_id):
            self.stop(job, cancelled(), ends_process=False)

    def now(self) -> list[str]:
        """The jobs whose calls run now, as ``QUEUE/JOB``, in the order they started."""
        with self._lock:
            return [f"{key}/{job.entry.job_id}" for key, job in self._jobs.values()]

    def ended(self, job: RunningJob) -> None:
        """``job``'s call has ended (its outcome is recorded, or dropped if stopped)."""
        with self._lock:
            self._jobs.pop(id(job), None)
        if job.stop is not None:
            self.watchdog.stop_ended(job.label)

    def stop(self, job: RunningJob, reason: Stopped, *, ends_process: bool = True) -> None:
        """Stop ``job``'s call, for ``reason`` (once; see the module's docstring). Not
        ``ends_process``: a plain handler that does not stop is left to finish (its outcome
        dropped) instead of ending the process."""
        if job.stop is not None:
            return
        job.stop = reason
        held = self._jobs.get(id(job))  # (its seat's key: its queue's name, the job)
        self.log.warning(
            "job_stopped",
            job=job.label,
            job_id=job.entry.job_id,
            queue=None if held is None else held[0],
            attempt=job.attempt,
            reason=str(reason),
        )
        if is_async(job.fn):
            self.aio.stop_call(job, reason)
            return
        ctx = job.ctx
        if ctx is not None:
            ctx.stop(reason)
        if ends_process:
            self.watchdog.stopped(job.label, STOP_GRACE if ctx is not None else 0.0)

    def cancelled(self, jobs: list[tuple[str, str]]) -> None:
        """Jobs cancelled while they ran (``queueworks.queue.job_stops``: (queue, job id)): each
        that runs here is stopped. Their cancel settled them already (their entries are
        gone: nobody runs them again); a plain handler that does not stop finishes, its
        outcome dropped (``cancel_ends_process``: the process ends instead, for a
        supervisor that replaces it)."""
        wanted = set(jobs)
        with self._lock:
            found = [job for k, job in self._jobs.values() if (k, job.entry.job_id) in wanted]
            now = time.monotonic()  # one read here but not started yet: stopped as it starts
            for pair in wanted - {(k, job.entry.job_id) for k, job in self._jobs.values()}:
                self._cancelled[pair] = now
            while len(self._cancelled) > CANCELLED_KEPT:
                del self._cancelled[next(iter(self._cancelled))]
        for job in found:
            self.stop(job, cancelled(), ends_process=self.cancel_ends_process)

    def _was_cancelled(self, queue: str, job_id: str) -> bool:
        """Whether job ``job_id`` of ``queue`` was cancelled before it started here (its
        worker had read it: a retry about to run, a job held behind others of its read)."""
        with self._lock:
            at = self._cancelled.pop((queue, job_id), None)
        return at is not None and time.monotonic() - at < CANCELLED_SECONDS

    def fenced(self, key: str) -> None:
        """Our membership ``key`` was found fenced (called again on every look while it is):
        each job running in it that another member now holds, or that was settled
        meanwhile, is stopped. One still pending on us runs on (nobody else runs it: no
        member reclaimed it yet; looked at again on the next call), and so does one whose
        stream is gone (an emptied Redis, a deleted queue: nobody runs it again either);
        what it returns is settled only if we rejoined first, and then only once."""
        with self._lock:
            jobs = [job for k, job in self._jobs.values() if k == key and job.stop is None]
        if not jobs:
            return
        pipe = self.r.pipeline(transaction=False)
        for job in jobs:
            entry = job.work.entry_id
            pipe.xpending_range(job.work.stream, GROUP, entry, entry, 1)
        for job, reply in zip(jobs, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, ResponseError):  # NOGROUP: no stream, no group
                continue
            if isinstance(reply, Exception):
                raise reply
            if reply and text(reply[0]["consumer"]) == self.me:
                continue
            self.stop(job, fenced())


def cancelled() -> Cancelled:
    return Cancelled("cancelled while it ran: it is recorded cancelled and never runs again")


def fenced() -> Fenced:
    return Fenced("its worker was fenced (pruned while it did not answer): it runs elsewhere")
