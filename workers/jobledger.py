"""The ledger of one member of a queue's node set: each job's outcome, settled in batches by
``settle_jobs.lua`` (ack and delete the entry, write the job's record, count it once), with
the enqueue -> start histogram and the per-second rate. Attempts are charged as for
subtasks (``Attempts``). Outcomes are kept by the stream their entry is on: the queue's
own, or a handler's aside stream (``workers.aside``), each settled by its own call.

A failed attempt is retried at once on this member, unless the queue's retry schedule (or
the job's own: ``queueworks.protocol.retry_policy``) says to wait: then it is settled as a retry
that waits (``retry_later.lua``, on the same pipeline as the settle), and the job leaves
the stream for the queue's scheduled zset, blocking nothing while it waits."""

from __future__ import annotations

import time
import traceback
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from queueworks.protocol import events
from queueworks.protocol.jobrecords import entry_job, entry_payload
from queueworks.protocol.messages import safe_text
from queueworks.protocol.models import StoredSpec
from queueworks.protocol.records import LATENCY_BUCKETS
from queueworks.protocol.retry_policy import RetryPolicy
from queueworks.queue.flow import Limits
from queueworks.scripts.bound import JobBatch
from queueworks.task.dependencies import plan_drain
from queueworks.tracing import hooks
from queueworks.transport.runner import run

from .flow_gate import Pump
from .ledger import Attempts, failed_reason
from .running_job import RunningJob
from .work import Gone, Work

LATENCY_SPAN = 3650 * 86400.0  # s: an enqueue -> start time beyond ten years is no sample


_BUCKET_NAMES = (*(repr(bound) for bound in LATENCY_BUCKETS), "+Inf")


def bucket_of(seconds: float) -> str:
    """The histogram bucket of a latency: the name of the first bound it does not pass."""
    return _BUCKET_NAMES[bisect_left(LATENCY_BUCKETS, seconds)]


class JobLedger(Attempts):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stream = self.tk.stream
        self.batch = JobBatch()  # of the queue's stream (the histogram's too)
        self.asides: dict[str, JobBatch] = {}  # of aside streams, by stream
        self._aside_prefix = self.tk.aside_stream("")  # an aside stream's name: its handler
        self._aside_at = len(self._aside_prefix)
        # on the pipeline, not yet settled: (handler of the aside stream or "", batch), when
        self.sent: tuple[list[tuple[str, JobBatch]], float] | None = None
        self.use(self.spec)
        self.pump: Pump | None = None  # the hand-on after a settle: its reads on the pipeline
        self.rate = 0.0  # jobs/s the last settle carried, over the time since the one before
        # the queue's members: a settle finds us gone from them if we were pruned (then it
        # settles nothing: what we ran is run again by the member that reclaimed it). Not
        # our heartbeat key in the queue: a queue's members keep none (``workers.lost``)
        self.fence = self.tk.members

    def use(self, spec: StoredSpec) -> None:
        """The queue's settings from now on (``QueueLoop.reconfigure``)."""
        self.spec = spec
        self.ttl = int(spec.result_ttl)
        self.retries = RetryPolicy(spec.retry_delay, spec.retry_backoff, spec.retry_max_delay)
        self.group_limit = Limits.of(spec).group

    def _batch(self, stream: str) -> JobBatch:
        if stream == self.stream:
            return self.batch
        found = self.asides.get(stream)
        if found is None:
            found = self.asides[stream] = JobBatch()
        return found

    def succeeded(self, job: RunningJob, body: str) -> None:
        """A job's handler returned ``body`` (JSON): settled done at the next flush."""
        job.outcome = body
        stream = job.work.stream
        batch = self.batch if stream == self.stream else self._batch(stream)
        batch.ok.append(job)

    def latency(self, seconds: float) -> None:
        """A job started ``seconds`` after it was enqueued (or became due); no sample if
        that is no time at all (an enqueue time written by hand: ``inf``, ``nan``)."""
        if not -LATENCY_SPAN <= seconds <= LATENCY_SPAN:
            return
        buckets = self.batch.buckets
        name = bucket_of(max(0.0, seconds))
        buckets[name] = buckets.get(name, 0.0) + 1
        buckets["sum"] = buckets.get("sum", 0.0) + max(0.0, seconds)
        buckets["count"] = buckets.get("count", 0.0) + 1

    def bury(self, job: RunningJob, reason: str, error: str) -> None:
        """Dead-letter a job at the next flush."""
        job.reason, job.outcome = reason, error[-8000:]
        work = job.work
        self._batch(work.stream).dead.append(job)
        self.log.warning(
            "job_dead",
            job=job.label,
            job_id=job.entry.job_id,
            queue=self.tk.task_id,
            attempt=work.attempt,
            reason=reason,
            attempts=work.attempt,
        )

    def reject(self, work: Work, why: str) -> None:
        """An entry that is no job of this queue: settled apart, never counted as a job."""
        entry = (work.entry_id, why, safe_text(entry_payload(work.fields)))
        self._batch(work.stream).rejected.append(entry)
        self.log.warning("entry_rejected", entry=work.entry_id, why=why)

    def failed(self, job: RunningJob, exc: BaseException) -> Work | None:
        """A handler raised: dead after ``max_attempts``; else the retry to run now
        (charged), or None if it waits for its time (settled so at the next flush)."""
        tb = "".join(traceback.format_exception(exc))
        work = job.work
        if work.attempt >= self.spec.max_attempts:
            self.bury(job, failed_reason(work.attempt), tb)
            return None
        wait = self.retries.for_job(job.entry.job_options).wait(work.attempt)
        if wait > 0:
            self._batch(work.stream).later.append((job, time.time() + wait, tb[-8000:]))
            self.log.info(
                "job_retry_later",
                job=job.label,
                job_id=job.entry.job_id,
                queue=self.tk.task_id,
                attempt=work.attempt,
                wait=round(wait, 3),
                error=repr(exc),
            )
            return None
        self.log.info(
            "job_retry",
            job=job.label,
            job_id=job.entry.job_id,
            queue=self.tk.task_id,
            attempt=work.attempt,
            error=repr(exc),
        )
        return self.retry(work)

    def exhausted(self, work: Work, why: str) -> None:
        entry = entry_job(work.entry_id, work.fields)
        if entry is None:
            self.reject(work, f"exceeded max_attempts: {why}")
            return
        entry = entry._replace(payload=safe_text(entry_payload(work.fields)))
        self.bury(RunningJob.unrun(work, entry, time.time()), "exceeded max_attempts", why)

    def bury_gone(self, stream: str, gone: Sequence[Gone]) -> None:
        for entry_id, deliveries in gone:
            work = Work(stream, entry_id, {}, deliveries)
            self.reject(work, "payload gone: entry deleted or trimmed while pending")

    def pending(self) -> bool:
        """Something recorded is not settled yet."""
        return bool(self.batch) or bool(self.batch.buckets) or bool(self.asides)

    def flush(self) -> None:
        pipe = self.r.pipeline(transaction=False)
        if self._put(pipe):
            self.settled(pipe.execute(raise_on_error=False))

    def flush_into(self, pipe: Any) -> bool:
        """Put the settle of everything recorded on ``pipe`` (it runs with the pipe's other
        commands: a read, say); False if there is nothing to settle. Execute the pipe with
        ``raise_on_error=False`` and give ``settled`` the replies of what this put on it.
        A settle that gives a group's slot back runs at once instead, on a pipe of its own:
        the slot is handed on after it, not after a read that may block (False too)."""
        if self.group_limit is not None and self._freed([self.batch, *self.asides.values()]):
            self.flush()
            return False
        return self._put(pipe)

    def _put(self, pipe: Any) -> bool:
        """``flush_into``'s settle on ``pipe``, whatever it gives back."""
        batch = self.batch
        self._flushed(len(batch) + sum(map(len, self.asides.values())))
        self.sent = None
        if self.asides:
            return self._flush_all_into(pipe)
        if not batch and not batch.buckets:
            return False
        self.batch = JobBatch()
        self.state.processed += len(batch)
        now = time.time()
        self.sent = ([(self.stream, batch)], now)
        fence = self.fence
        _traced(batch)
        self.scripts.settle_jobs(self.tk, batch, self.me, now, self.ttl, client=pipe, fence=fence)
        if batch.later:
            self.scripts.retry_later(self.tk, batch.later, self.me, now, client=pipe, fence=fence)
        if batch.dead or batch.rejected:
            self._dead_lettered(pipe, [batch])
        self._pump_into(pipe, [batch])
        return True

    def _flushed(self, jobs: int) -> None:
        """A settle of ``jobs`` jobs goes out now: the rate it carries (``rate``)."""
        now = time.monotonic()
        since, self.last_flush = now - self.last_flush, now
        self.rate = jobs / since if since > 0 else 0.0

    def _pump_into(self, pipe: Any, batches: Sequence[JobBatch]) -> None:
        """Last on ``pipe``, after the settles that gave their slots back: the reads of
        the heads of those groups' wait lists, for the pump that hands the slots on (only
        if a settled job had a group; ``settled`` runs the pump if a job waits)."""
        self.pump = None
        if self.group_limit is None:
            return
        if freed := self._freed(batches):
            self.pump = Pump(pipe, self.tk, self.group_limit, freed)

    @staticmethod
    def _freed(batches: Sequence[JobBatch]) -> dict[str, int]:
        """The groups whose slots the settles of ``batches`` give back: how many each."""
        freed: dict[str, int] = {}
        for b in batches:
            for job in (*b.ok, *b.dead):
                if g := job.entry.job_options.group:
                    freed[g] = freed.get(g, 0) + 1
        return freed

    def _flush_all_into(self, pipe: Any) -> bool:
        """``flush_into`` with jobs of other streams too (aside, bands): a settle per
        stream."""
        batch = self.batch
        sent = [(self.stream, batch)] if batch or batch.buckets else []
        sent += [(stream, b) for stream, b in self.asides.items() if b]
        self.batch, self.asides = JobBatch(), {}
        now = time.time()
        self.sent = (sent, now)
        fence = self.fence
        for stream, b in sent:
            self.state.processed += len(b)
            _traced(b)
            self.scripts.settle_jobs(
                self.tk, b, self.me, now, self.ttl, pipe, self._aside(stream), fence, stream
            )
        for stream, b in sent:
            if b.later:
                self.scripts.retry_later(
                    self.tk, b.later, self.me, now, pipe, self._aside(stream), fence, stream
                )
        if any(b.dead or b.rejected for _, b in sent):
            self._dead_lettered(pipe, [b for _, b in sent])
        self._pump_into(pipe, [b for _, b in sent])
        return True

    def _aside(self, stream: str) -> str:
        """The handler whose aside stream ``stream`` is ('' for the queue's own or a
        band's)."""
        return stream[self._aside_at :] if stream.startswith(self._aside_prefix) else ""

    def _dead_lettered(self, pipe: Any, batches: Sequence[JobBatch]) -> None:
        """The event of the dead letters in ``batches``: how many, the first one's id and
        reason (a job's, else a rejected entry's)."""
        count = sum(len(b.dead) + len(b.rejected) for b in batches)
        dead = [job for b in batches for job in b.dead]
        if dead:
            first = dead[0]
            events.dead_lettered(
                pipe, self.keys, self.tk.task_id, count, first.reason, job=first.entry.job_id
            )
            return
        entry, why, _ = next(r for b in batches for r in b.rejected)
        events.dead_lettered(pipe, self.keys, self.tk.task_id, count, why, entry=entry)

    def settled(self, replies: Sequence[Any]) -> None:
        """The replies of what ``flush_into`` put on a pipe: a settle (or retry_later) that
        Redis refused for want of the script (NOSCRIPT: it lost its script cache) runs
        again, loading it; any other error is raised."""
        sent, self.sent = self.sent, None
        batches, now = sent if sent is not None else ([], 0.0)
        pump, self.pump = self.pump, None
        heads = replies  # the last replies: the pump's reads of the wait lists' heads
        if pump is not None:
            replies = pump.replies(replies)
        moved = 0  # dependents the settles moved to the queue's outbox
        for i, reply in enumerate(replies):  # the settles first, one per batch, in order
            laters = len(batches) + self._laters(batches)
            if isinstance(reply, NoScriptError) and i < len(batches):
                stream, batch = batches[i]
                aside = self._aside(stream)
                reply = self.scripts.settle_jobs(
                    self.tk, batch, self.me, now, self.ttl, None, aside, self.fence, stream
                )
            elif isinstance(reply, NoScriptError) and i < laters:
                stream, batch = [(a, b) for a, b in batches if b.later][i - len(batches)]
                aside = self._aside(stream)
                reply = self.scripts.retry_later(
                    self.tk, batch.later, self.me, now, None, aside, self.fence, stream
                )
            elif isinstance(reply, Exception):
                raise reply
            if i < len(batches) and len(reply) > 3:
                moved += int(reply[3])
            if (i < len(batches) and len(reply) > 4) or (
                len(batches) <= i < laters and len(reply) > 2
            ):
                self._fenced(batches, i)
        if pump is not None:  # after the settles (one run again included): slots are free
            pump.run(self.scripts, heads)
        if moved:  # jobs wait for these: release them now (the leader's backstop else)
            run(self.r, self.scripts, plan_drain(self.keys, [self.tk.task_id]))

    def _fenced(self, batches: Sequence[tuple[str, JobBatch]], i: int) -> None:
        """The settle (or retry) ``i`` of ``batches`` found us pruned and wrote nothing:
        those jobs are no longer ours (the member that reclaimed them runs them again)."""
        jobs = len(batches[i][1]) if i < len(batches) else 0
        self.state.processed -= jobs
        self.log.warning("settle_fenced", jobs=jobs)

    @staticmethod
    def _laters(batches: Sequence[tuple[str, JobBatch]]) -> int:
        """How many ``retry_later`` calls followed the settles of ``batches``."""
        return sum(1 for _, b in batches if b.later)


def _traced(batch: JobBatch) -> None:
    """While tracing: the trace id of each job of ``batch`` that ran under a span, which its
    settle keeps on its record (``JOB_TRACE``)."""
    tracer = hooks.consumer
    if tracer is not None:
        for job in (*batch.ok, *batch.dead):
            if getattr(job, "span", None) is not None:
                batch.traces[job.entry.job_id] = tracer.trace_id(job)
