"""Queue mode (``TaskSpec(mode="queue")``): jobs enqueued one at a time, each naming its own
handler. Members wait blocked on the stream (``XREADGROUP BLOCK``), so a job starts about one
round trip after it was enqueued; each read carries the settle of what ran before it (one
round trip per batch). Reclaim, attempts, timeouts and dead letters are the subtasks' ones.

One bad job is the job's problem, never the queue's: a job whose handler this worker may
not run (outside its ``--allow`` prefixes) is set aside to wait alone for a member that may
(``workers.aside``); one whose handler cannot be imported here (no such module, an import
that fails, no such function, not a plain function) is dead at once, the reason naming the
handler and the error. The member goes on serving the queue either way; it never refuses it.

The leader also moves due delayed jobs onto the stream. A worker serves many queues at once
from one loop (``workers.queue_set``): this loop's parts are its steps.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from typing import Any, cast

from redis.exceptions import ResponseError

from queueworks.context import Cancelled, JobContext, Suspended, call_ended
from queueworks.errors import NotJSON
from queueworks.logs import writes_info
from queueworks.process import ColdStop
from queueworks.protocol.jobrecords import ENTRY_PAYLOAD, BadEntry, JobEntry, decode_entry
from queueworks.protocol.messages import from_json, text, to_json
from queueworks.protocol.models import NOT_ALLOWED, StoredSpec
from queueworks.protocol.records import QUEUE_BANDS, QUEUE_PAUSED, QUEUE_SETTINGS
from queueworks.queue.flow import Limits
from queueworks.queue.queue_settings import MAX_GROUP_LIMIT
from queueworks.queue.vanished import gone_stream
from queueworks.task.dependencies import TASKS_SECONDS, plan_drain, plan_task_backstop
from queueworks.tracing import hooks
from queueworks.transport.runner import run as run_plan

from .aside import Aside
from .flow_gate import BandGate, GroupSlots, RateGate
from .handlers import Handler, HandlerRefused, resolve
from .heartbeat import Seat
from .inflight import Call, is_async
from .jobledger import JobLedger
from .live_settings import LiveSettings
from .loop import Run
from .progress import ProgressWriter
from .running_job import RunningJob
from .work import Leave, Work

BLOCK_MS = 100  # a member waits this long on the stream per read, then looks around
CHECK_SECONDS = 0.05  # a read re-checks membership and epoch at least this often
DUTY_SECONDS = 0.25  # the leader's duties (due jobs) and everyone's backstop, this often
# ... for each queue, with few queues; a worker serving many spreads them out, so what they
# cost it per second stays level (``QueueLoop.spread``)
CHECKS_PER_SECOND = 100
DUTIES_PER_SECOND = 50
# ... and a worker told of its queues' jobs, epochs and delayed jobs by notifications
# (``workers.ready``): the checks and duties are only the backstop then
TOLD_CHECKS_PER_SECOND = 10
TOLD_DUTIES_PER_SECOND = 10
SETTLE_SECONDS = 0.002  # jobs that ran within this of the last settle wait for the next
BUSY_SETTLE_SECONDS = 0.01  # ... within this, under load: settles carrying BUSY_RATE jobs/s
BUSY_RATE = 1000.0
SETTLE_JOBS = 100  # so many jobs waiting are settled at once, whatever the time
FLUSH_SECONDS = 0.05  # settle at least this often while a batch runs
TARGET_BATCH_SECONDS = 0.2  # read about this much work at once
DUE_BATCH = 100
_PAYLOAD_FIELD = f"field '{ENTRY_PAYLOAD}'"


class QueueLoop:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.queue = run.tk.task_id
        self.ledger = JobLedger(run.r, run.scripts, run.tk, run.keys, run.spec, run.state, run.log)
        self.progress = ProgressWriter(run.scripts, run.tk, int(run.spec.result_ttl), run.log)
        self.handlers: dict[str, Handler | HandlerRefused] = {}
        self.allow = tuple(run.allow)
        for path in sorted(text(h) for h in run.r.smembers(run.tk.handlers)):
            self._handler(path)  # imported once, before the first job
        self.aside = Aside(run, self._reads_aside)
        limits = Limits.of(run.spec)
        self.gate = RateGate(run, limits.rate, self.aside) if limits.rate is not None else None
        self.bands = BandGate(run, self.aside)  # (a rate gate reads the bands in order too)
        self.slots = GroupSlots(run, limits.group) if limits.group is not None else None
        self.duties = LeaderDuties(run)
        self.live = LiveSettings(run)
        self.check_every = self.check_least = min(CHECK_SECONDS, run.membership.ttl_ms / 10_000)
        self.checked_at = 0.0
        self.paused = False  # the queue's paused flag, as the last check read it: no reads
        self.avg_seconds = 0.0

        self.batch_at = 0.0  # when the batch running now began (a read returned it)

    def serve(self) -> None:
        """A queue is served with the worker's other queues (``workers.queue_set``), never
        through a run of its own: a queue's id in ``assign`` (an older controller's word) is
        no work for this run."""
        raise Leave("queue")

    def close(self, reason: str) -> None:
        """Park what it holds of aside streams (the run hands back the queue's stream's)."""
        self.aside.hand_back()

    # -- reading --------------------------------------------------------------------------

    def spread(self, queues: int, *, told: bool = False) -> None:
        """The worker serves ``queues`` queues: check this one's membership and do its
        duties less often the more there are (at most ``CHECKS_PER_SECOND`` checks and
        ``DUTIES_PER_SECOND`` duties a second over all of them; ``told``: the worker is told
        of jobs, epochs and delayed jobs by notifications, ``TOLD_...`` then). What must be
        seen sooner comes another way: a new epoch by notification, a pause or a new
        setting through the events (``Scout.touched``), a prune of this worker by its own
        heartbeat."""
        checks = TOLD_CHECKS_PER_SECOND if told else CHECKS_PER_SECOND
        duties = TOLD_DUTIES_PER_SECOND if told else DUTIES_PER_SECOND
        self.check_every = max(self.check_least, queues / checks)
        self.duties.every = max(DUTY_SECONDS, queues / duties)
        # each queue's turn at a place of its own in the interval: queues joined together
        # do not all come due in one round (their duties' round trips would stall it)
        now = time.monotonic()
        self.checked_at = min(self.checked_at, now - random.random() * self.check_every)
        self.duties.duties_at = now - random.random() * self.duties.every

    def touched(self) -> None:
        """The queue was paused, resumed or changed: its next read checks it."""
        self.checked_at = 0.0

    def check_due(self, now: float) -> bool:
        return now - self.checked_at >= self.check_every

    def put_looks(self, pipe: Any, now: float, settle: bool) -> Callable[[list[Any]], None]:
        """Put on ``pipe`` what this member's next read carries besides the read: the settle
        of what ran (``settle``), and when due the membership check (with the queue record's
        flags and versions) and the look at the aside set (``workers.aside``). Returns what
        takes their replies (the pipe's, all of them)."""
        run = self.run
        check = self.check_due(now)
        look = check and self.aside.look_due(now)
        start = len(pipe)
        if settle:
            self.ledger.flush_into(pipe)
        base = len(pipe)
        if check:
            pipe.zscore(run.tk.members, run.me)
            pipe.get(run.tk.epoch)
            pipe.hmget(run.tk.record, [QUEUE_PAUSED, QUEUE_SETTINGS, QUEUE_BANDS])
        looks = self.aside.look_on(pipe) if look else 0

        def looked(replies: list[Any]) -> None:
            self.ledger.settled(replies[start:base])
            if check:
                member, epoch, flags = replies[base : base + 3]
                for reply in (member, epoch):
                    if isinstance(reply, Exception):
                        raise reply
                if not isinstance(flags, list):  # (a record that is no hash: none set)
                    flags = [None, None, None]
                # a change suspends us: what was read stays ours, run after the re-rank
                self.checked_at = now
                run.membership.fence(member, epoch)
                self.paused = flags[0] == b"1"
                self.live.seen(flags[1])
                spec = self.live.changed()  # before any job this read brings starts
                if spec is not None:
                    self.reconfigure(spec)
                if self.aside.seen(flags[2]):  # a band more: the next round looks again
                    self.touched()
            if look:
                at = base + 3 if check else base
                self.aside.looked(replies[at : at + looks], now)

        return looked

    def read_failed(self, error: Exception) -> None:
        """A read failed: the queue's stream or group is gone (Redis lost its keys: the
        membership went with it, ``TaskRun.gone``); or, a read that covered aside streams,
        one was emptied and deleted meanwhile (read the queue's stream alone until the next
        look); else the error is raised."""
        if gone_stream(error) == self.run.tk.stream:  # (a cluster's reads never wait)
            self.run.gone()
            return
        if len(self.aside.read) > 1 and isinstance(error, ResponseError):
            self.aside.lost(time.monotonic())
            return
        raise error

    def settle_now(self, now: float) -> tuple[bool, int]:
        """Whether this read carries the settle of what ran, and how long it blocks (ms).
        A settle waits while the last one is less than ``SETTLE_SECONDS`` old, and the read
        blocks no longer than that: jobs that come one by one but close together are
        settled a few per Lua call, not one each (the settle is most of a job's cost in
        Redis), and a job on its own is settled with the read that follows it. Under load
        (the last settle carried ``BUSY_RATE`` jobs/s or more) the wait is
        ``BUSY_SETTLE_SECONDS``, or until ``SETTLE_JOBS`` jobs wait: more jobs per settle
        where a job's result comes that much later anyway; it falls back as the rate does."""
        block = self.duties.block_ms()
        ledger = self.ledger
        if not ledger.pending():
            return False, block
        wait = settle_wait(now, ledger.last_flush, ledger.rate, len(ledger.batch))
        if wait <= 0:
            return True, block
        return False, max(1, min(block, int(wait * 1000) + 1))

    def busy(self) -> bool:
        """Whether the queue is under load here: its last settle carried ``BUSY_RATE``
        jobs/s or more."""
        return self.ledger.rate >= BUSY_RATE

    def read_count(self) -> int:
        if self.avg_seconds <= 0:
            return 1
        return max(1, min(self.run.batch_size, int(TARGET_BATCH_SECONDS / self.avg_seconds)))

    # -- running --------------------------------------------------------------------------

    def run_held(self) -> None:
        run = self.run
        s = run.state
        ran, started = 0, time.monotonic()
        self.batch_at = started
        while run.held and not halted(s):
            work = self.ledger.start(run.held.popleft())
            if work is not None:
                if not self._run_one(work):
                    break
                ran += 1
        self._ran(ran, started)

    def _ran(self, ran: int, started: float) -> None:
        self.ran_for(ran, time.monotonic() - started)

    def ran_for(self, ran: int, spent: float) -> None:
        """``ran`` jobs took ``spent`` seconds: how long a job takes, on average (what a
        read's count follows)."""
        if ran:
            each = spent / ran
            self.avg_seconds = each if self.avg_seconds == 0 else 0.5 * (self.avg_seconds + each)

    def run_fresh_one(self, work: Work) -> bool:
        """Run one entry just read (a worker serving many queues runs them in turn); False
        if this queue's batch stops here (it and what follows wait in ``held``)."""
        if halted(self.run.state):
            self.run.held.append(work)
            return False
        return self._run_one(work)

    def _decoded(self, work: Work) -> RunningJob | None:
        """The job an entry holds, ready to run; None if it was dealt with at once (no job
        of ours: rejected; a handler that cannot be imported: dead; one this worker may not
        run: set aside)."""
        ledger = self.ledger
        try:
            entry = decode_entry(work.entry_id, work.fields)
            payload = from_json(entry.payload, _PAYLOAD_FIELD)
        except BadEntry as exc:
            ledger.reject(work, str(exc))
            return None
        except NotJSON as exc:
            ledger.reject(work, f"malformed entry: {exc}")
            return None
        handler = self._handler(entry.handler)
        if isinstance(handler, HandlerRefused):
            self._refused(work, entry, handler)
            return None
        if self.slots is not None and entry.options and not self._slot(work, entry):
            return None
        started = time.time()
        if work.attempt == 1 and entry.enqueued:
            with contextlib.suppress(ValueError):  # a time that is no number: no sample
                ledger.latency(started - float(entry.enqueued))
        if not handler.takes_ctx:
            job = RunningJob(work, entry, handler.fn, (payload,), started)
        else:
            ctx = self._context(entry, work)
            job = RunningJob(work, entry, handler.fn, (payload, ctx), started)
            job.ctx = ctx
        tracer = hooks.consumer
        if tracer is None:
            self.run.log.info(
                "job_started", job_id=entry.job_id, queue=self.queue, attempt=work.attempt
            )
            return job
        tracer.start(job, self.queue, self.run.me)
        log = self.run.log
        if writes_info(log):  # the line under the job's span (its trace_id, span_id)
            with tracer.attached(job):
                log.info("job_started", job_id=entry.job_id, queue=self.queue, attempt=work.attempt)
        return job

    def _slot(self, work: Work, entry: JobEntry) -> bool:
        """Whether the job may run now: it has no group, or it holds a slot of its group
        (else it waits for one off the stream, or is no job of ours)."""
        assert self.slots is not None
        group = entry.job_options.group  # (parsed once, with the entry)
        if group is None:
            return True
        took = self.slots.take(work, entry, group)
        if took == -2:
            self.ledger.reject(work, "no such job waiting in this queue (group slot)")
        return took == 1

    def _run_one(self, work: Work) -> bool:
        """Run one job and record its outcome; False if the batch should stop here (a
        retry or a suspended job waits first in ``held``)."""
        run = self.run
        job = self._decoded(work)
        if job is None:
            return True
        # settle at least every FLUSH_SECONDS of a batch (not counting the wait for its read)
        if time.monotonic() > max(self.ledger.last_flush, self.batch_at) + FLUSH_SECONDS:
            self.ledger.flush()
        fn = job.fn
        run.running.started(run.state, job)
        try:
            if job.stop is not None:  # stopped before it started: it does not
                return self._outcome(job, None, job.stop)
            if is_async(fn):
                value = run.aio.run_call(job, run.spec.subtask_timeout)
            else:
                value = run.watchdog.call(job.label, fn, *job.args)
        except ColdStop:
            self.ledger.interrupted.add(work.entry_id)  # it started: it stays ours, charged
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt...: the handler's own
            return self._outcome(job, None, exc)
        finally:
            run.running.ended(job)
        return self._outcome(job, value, None)

    def _outcome(self, job: RunningJob, value: Any, error: BaseException | None) -> bool:
        """Record how a job's call ended; False if it waits again first in ``held``. A job
        stopped while it ran (``workers.stopping``) is no longer ours: nothing of it is
        recorded, whatever its call did. Its lines are written under its span while
        tracing, which then ends."""
        if job.span is None:
            return self._ended(job, value, error)
        tracer = hooks.consumer
        assert tracer is not None
        with tracer.attached(job):
            again = self._ended(job, value, error)
        if job.stop is not None:  # no outcome of its own: cancelled, or run elsewhere now
            fate = "cancelled" if isinstance(job.stop, Cancelled) else "stopped"
        elif isinstance(error, Suspended):
            fate = "suspended"
        elif job.reason:
            fate = "dead"
        else:
            fate = "retry" if error is not None else ""
        tracer.end(job, error, fate)
        return again

    def _ended(self, job: RunningJob, value: Any, error: BaseException | None) -> bool:
        run, ledger = self.run, self.ledger
        if job.stop is not None:
            run.log.warning(
                "stopped_job_dropped",
                job=job.label,
                job_id=job.entry.job_id,
                queue=self.queue,
                attempt=job.attempt,
                reason=str(job.stop),
            )
            return True
        if job.ctx is not None:
            call_ended(job.ctx)  # its last progress report, before the settle
        if isinstance(error, Suspended):  # runs again after the re-rank, same attempt
            run.held.appendleft(job.work)
            return False
        entry = job.entry
        if error is not None:
            run.log.info(
                "job_failed",
                job_id=entry.job_id,
                queue=self.queue,
                attempt=job.attempt,
                seconds=round(time.time() - job.started_at, 6),
                error=repr(error),
            )
            retry = ledger.failed(job, error)
            if retry is None:
                return True
            run.held.appendleft(retry)
            return False
        try:
            body = to_json(value, "result")
        except NotJSON as exc:
            ledger.bury(job, "result is not JSON", str(exc))
            return True
        ledger.succeeded(job, body)
        run.log.info(
            "job_done",
            job_id=entry.job_id,
            queue=self.queue,
            attempt=job.attempt,
            seconds=round(time.time() - job.started_at, 6),
        )
        return True

    # -- many in flight (--concurrency > 1): workers.queue_set.Flight ---------------------

    def call_for(self, work: Work) -> Call | None:
        job = self._decoded(work)  # the running job is its own call
        if job is not None:
            self.run.running.started(self.run.state, job)
        return job

    def record(self, call: Call) -> None:
        job = cast(RunningJob, call)
        self.run.running.ended(job)
        self._outcome(job, call.value, call.error)

    def tick(self) -> None:
        self.duties.tick()
        self.aside.tick()
        if self.slots is not None:
            self.slots.backstop()

    def reconfigure(self, spec: StoredSpec) -> None:
        """The queue's settings changed (``workers.live_settings``): the jobs started from
        now on run with ``spec``'s (timeout, attempts, result TTL, retries, limits)."""
        run = self.run
        run.spec = spec
        self.ledger.use(spec)
        self.progress.ttl = int(spec.result_ttl)
        limits = Limits.of(spec)
        if limits.rate is None:
            self.gate = None
        elif self.gate is None:
            self.gate = RateGate(run, limits.rate, self.aside)
        else:
            self.gate.rate = limits.rate
        if limits.group is not None:
            if self.slots is None:
                self.slots = GroupSlots(run, limits.group)
            self.slots.limit = limits.group
        elif self.slots is not None:  # jobs may still wait for a slot: the pump hands them on
            self.slots.limit = MAX_GROUP_LIMIT

    def _context(self, entry: JobEntry, work: Work) -> JobContext:
        run = self.run
        role = run.membership.role
        assert role is not None
        return JobContext(
            queue=run.tk.task_id,
            job_id=entry.job_id,
            attempt=work.attempt,
            role=role,
            worker_id=run.me,
            log=run.log.bind(job_id=entry.job_id, queue=self.queue, attempt=work.attempt),
            allow=self.allow,
            _suspend=run.state.halt,  # never a change of the queue's members
            _sink=self.progress,
            _named=entry.named,
        )

    def _handler(self, path: str) -> Handler | HandlerRefused:
        """The job's handler, resolved once per path (a refusal too)."""
        found = self.handlers.get(path)
        if found is None:
            try:
                found = resolve(path, self.run.allow)  # (the path parsed there, once)
            except HandlerRefused as exc:
                found = exc
            except ValueError as exc:
                found = HandlerRefused(str(exc), imported=True)
            self.handlers[path] = found
        return found

    def _reads_aside(self, path: str) -> bool:
        """Whether this member reads the aside stream of handler ``path``: unless the
        handler is outside its --allow (one it cannot import, it dead-letters)."""
        found = self._handler(path)
        return not (isinstance(found, HandlerRefused) and found.kind == NOT_ALLOWED)

    def _refused(self, work: Work, entry: JobEntry, exc: HandlerRefused) -> None:
        """A job whose handler this member cannot run: set aside if it may not (another
        member may), else (it cannot be imported, is no handler) dead at once, with the
        reason: it would fail the same way on every attempt."""
        ledger = self.ledger
        if exc.kind != NOT_ALLOWED:
            ledger.bury(RunningJob.unrun(work, entry, time.time()), str(exc), str(exc))
        elif work.stream == self.run.tk.stream:
            moved = self.aside.set_aside(work, entry, exc)
            if moved == -1:
                ledger.reject(work, "no such job in this queue (set aside)")
        # (an aside stream's job: read only by members that may run it)


def halted(seat: Seat) -> bool:
    """Whether a queue's member starts no more jobs until its next safe point: the worker
    stops, was given a task, or was pruned (it rejoins first). A new epoch is no reason: a
    change of a queue's members never pauses a job (the re-rank waits for nothing)."""
    return seat.halt.is_set() or seat.stopping or seat.fenced


def settle_wait(now: float, last_flush: float, rate: float, waiting: int) -> float:
    """Seconds until the settle of ``waiting`` jobs that ran is due (<= 0: now), the last
    settle made at ``last_flush`` carrying ``rate`` jobs/s (``QueueLoop.settle_now``)."""
    if waiting >= SETTLE_JOBS:
        return 0.0
    return last_flush + (BUSY_SETTLE_SECONDS if rate >= BUSY_RATE else SETTLE_SECONDS) - now


class LeaderDuties:
    """What a queue's leader does besides running jobs, every ``DUTY_SECONDS`` (at once when
    a delayed job is due): move due delayed jobs onto the stream, and the backstop of
    dependents (``queueworks.task.dependencies``): its queue's outbox drained when it is not
    empty, a few tasks' every ``TASKS_SECONDS``. Every member's own look around (the queue
    cancelled? a wedged member's jobs?) rides on the same tick."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.duties_at = 0.0
        self.every = DUTY_SECONDS  # how often (``QueueLoop.spread``)
        self.next_due: float | None = None  # the leader's: when the next delayed job is due
        self.tasks_at = 0.0  # the leader's last look at tasks' outboxes (monotonic)

    def poke(self) -> None:
        """A delayed job was added (a notification, from another thread): look at once."""
        self.duties_at = 0.0

    def tick(self) -> None:
        due = self.next_due is not None and time.time() >= self.next_due
        if due or time.monotonic() - self.duties_at >= self.every:
            self._duties()

    def block_ms(self) -> int:
        """ms to wait on the stream: less if a delayed job is due sooner (the leader)."""
        if self.next_due is None:
            return BLOCK_MS
        return max(1, int(min(BLOCK_MS, (self.next_due - time.time()) * 1000)))  # due at inf

    def _duties(self) -> None:
        """Every ``DUTY_SECONDS``: the run's look around (the queue cancelled? a wedged
        member's jobs?); the leader moves due jobs."""
        self.duties_at = time.monotonic()
        self.run.look_around()
        role = self.run.membership.role
        if role is None or not role.leader:
            self.next_due = None
            return
        self._promote_due()

    def _promote_due(self) -> None:
        run = self.run
        now = time.time()
        pipe = run.r.pipeline(transaction=False)
        pipe.zrangebyscore(run.tk.scheduled, "-inf", now, start=0, num=DUE_BATCH)
        pipe.zrange(run.tk.scheduled, 0, 0, withscores=True)
        pipe.llen(run.tk.released)
        due, first, outbox = pipe.execute()
        if outbox or time.monotonic() - self.tasks_at >= TASKS_SECONDS:
            self._release(bool(outbox))
        if due:
            by_band: dict[str, list[str]] = {}  # each job goes back onto its own band
            for job_id in map(text, due):
                by_band.setdefault(run.tk.stream_of(job_id), []).append(job_id)
            moved = sum(run.scripts.promote_due(run.tk, ids) for ids in by_band.values())
            run.log.info("jobs_due", moved=moved)
            self.duties_at = 0.0  # more may be due: look again at once
        self.next_due = float(first[0][1]) if first and not due else None

    def _release(self, outbox: bool) -> None:
        """The backstop of dependents: the queue's outbox (``outbox``: not empty), and
        every ``TASKS_SECONDS`` a few tasks' outboxes."""
        run = self.run
        released = 0
        if outbox:
            released += run_plan(run.r, run.scripts, plan_drain(run.keys, [run.tk.task_id]))
        if time.monotonic() - self.tasks_at >= TASKS_SECONDS:
            self.tasks_at = time.monotonic()
            released += run_plan(run.r, run.scripts, plan_task_backstop(run.keys))
        if released:
            run.log.info("dependents_released", count=released)
