"""Queue mode (``TaskSpec(mode="queue")``): jobs enqueued one at a time, each naming its own
handler. Members wait blocked on the stream (``XREADGROUP BLOCK``), so a job starts about one
round trip after it was enqueued; each read carries the settle of what ran before it (one
round trip per batch). Reclaim, attempts, timeouts and dead letters are the subtasks' ones.

A job whose handler this worker may not run (outside its ``--allow`` prefixes, or its module
cannot be imported here) is not dead-lettered: the worker hands it back, uncharged, refuses
the queue and leaves (``Run.refuse``). A job whose handler's module imports but has no such
function is the job's fault: dead-lettered with that reason.

The leader also moves due delayed jobs onto the stream, and says how many nodes the queue
wants (``want`` in its record): as many as it may have while jobs wait unread, ``min_nodes``
after ``idle_after`` seconds in which no job finished.
"""

from __future__ import annotations

import re
import time
from typing import Any

from queueworks import events
from queueworks.connection import text
from queueworks.context import JobContext, Suspended
from queueworks.messages import NotJSON, from_json, to_json
from queueworks.models import NOT_ALLOWED, parse_handler_path
from queueworks.queues import IDLE_AFTER
from queueworks.signals import ColdStop
from workers.handlers import Handler, HandlerRefused, resolve
from workers.jobledger import JobLedger
from workers.loop import Run
from workers.work import Entries, Leave, Work

BLOCK_MS = 100  # a member waits this long on the stream per read, then looks around
CHECK_SECONDS = 0.05  # a read re-checks membership and epoch at least this often
DUTY_SECONDS = 0.25  # the leader's duties (due jobs) and everyone's backstop, this often
DEMAND_SECONDS = 1.0  # the leader reconsiders how many nodes the queue wants
SETTLE_SECONDS = 0.002  # jobs that ran within this of the last settle wait for the next
FLUSH_SECONDS = 0.05  # settle at least this often while a batch runs
TARGET_BATCH_SECONDS = 0.2  # read about this much work at once
DUE_BATCH = 100
_JOB_ID = re.compile(rb"^[0-9a-f]{1,64}$")


class QueueLoop:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.ledger = JobLedger(run.r, run.scripts, run.tk, run.keys, run.spec, run.state, run.log)
        self.handlers: dict[str, Handler | HandlerRefused] = {}
        for path in sorted(text(h) for h in run.r.smembers(run.tk.handlers)):
            handler = self._handler(path)
            if isinstance(handler, HandlerRefused) and self._refuses(handler):
                raise handler  # before joining: the run refuses the queue
        options = run.spec.options.get("queue", {})
        self.idle_after = float(options.get("idle_after", IDLE_AFTER))
        self.check_every = min(CHECK_SECONDS, run.membership.ttl_ms / 10_000)
        self.checked_at = 0.0
        self.duties_at = 0.0
        self.demand_at = 0.0
        self.next_due: float | None = None  # the leader's: when the next delayed job is due
        self.settled_seen: tuple[int, float] = (-1, time.monotonic())  # (done+dead, since)
        self.avg_seconds = 0.0
        self.batch_at = 0.0  # when the batch running now began (a read returned it)

    def serve(self) -> None:
        run = self.run
        while True:
            run.check()
            due = self.next_due is not None and time.time() >= self.next_due
            if due or time.monotonic() - self.duties_at >= DUTY_SECONDS:
                self._duties()
            if run.held:
                self._run_held()
                continue
            entries = self._read()
            if entries:
                self._run_fresh(entries)

    def close(self, reason: str) -> None:
        """Nothing of its own to clean up (the run settles and hands back what it holds)."""

    # -- reading --------------------------------------------------------------------------

    def _read(self) -> Entries | None:
        """Wait on the stream for new jobs, with the settle of what ran before and (at
        least every ``check_every``) the membership check, in one round trip."""
        run = self.run
        now = time.monotonic()
        settle, block = self._settle_now(now)
        check = now - self.checked_at >= self.check_every
        group, me, count = run.tk.group, run.me, self._read_count()
        streams: dict[Any, Any] = {run.tk.stream: ">"}
        if not settle and not check:  # the read alone: no pipeline to build
            alone: Any = run.r.xreadgroup(group, me, streams, count=count, block=block)
            return alone[0][1] if alone else None
        pipe = run.r.pipeline(transaction=False)
        if settle:
            self.ledger.flush_into(pipe)
        base = len(pipe)
        if check:
            pipe.zscore(run.tk.members, run.me)
            pipe.get(run.tk.epoch)
        pipe.xreadgroup(group, me, streams, count=count, block=block)
        replies = pipe.execute(raise_on_error=False)
        self.ledger.settled(replies[:base])
        replies = replies[base:]
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        if check:  # a change suspends us: what was read stays ours, run after the re-rank
            self.checked_at = now
            run.membership.fence(replies[0], replies[1])
        reply = replies[-1]
        return reply[0][1] if reply else None

    def _settle_now(self, now: float) -> tuple[bool, int]:
        """Whether this read carries the settle of what ran, and how long it blocks (ms).
        A settle waits while the last one is less than ``SETTLE_SECONDS`` old, and the read
        blocks no longer than that: jobs that come one by one but close together are
        settled a few per Lua call, not one each (the settle is most of a job's cost in
        Redis), and a job on its own is settled with the read that follows it."""
        block = self._block()
        if not self.ledger.pending():
            return False, block
        wait = self.ledger.last_flush + SETTLE_SECONDS - now
        if wait <= 0:
            return True, block
        return False, max(1, min(block, int(wait * 1000) + 1))

    def _block(self) -> int:
        """ms to wait on the stream: less if a delayed job is due sooner (the leader)."""
        if self.next_due is None:
            return BLOCK_MS
        return max(1, min(BLOCK_MS, int((self.next_due - time.time()) * 1000)))

    def _read_count(self) -> int:
        if self.avg_seconds <= 0:
            return 1
        return max(1, min(self.run.batch_size, int(TARGET_BATCH_SECONDS / self.avg_seconds)))

    # -- running --------------------------------------------------------------------------

    def _run_fresh(self, entries: Entries) -> None:
        run = self.run
        s = run.state
        ran, started = 0, time.monotonic()
        self.batch_at = started
        stream = run.tk.stream
        for i, (raw_id, fields) in enumerate(entries):
            if s.suspend.is_set() or s.stopping or s.fenced:
                run.held.extend(Work(stream, e.decode(), f, 1) for e, f in entries[i:])
                break
            if not self._run_one(Work(stream, raw_id.decode(), fields, 1)):
                run.held.extend(Work(stream, e.decode(), f, 1) for e, f in entries[i + 1 :])
                break
            ran += 1
        self._ran(ran, started)

    def _run_held(self) -> None:
        run = self.run
        s = run.state
        ran, started = 0, time.monotonic()
        self.batch_at = started
        while run.held and not (s.suspend.is_set() or s.stopping or s.fenced):
            work = self.ledger.start(run.held.popleft())
            if work is not None:
                if not self._run_one(work):
                    break
                ran += 1
        self._ran(ran, started)

    def _ran(self, ran: int, started: float) -> None:
        if ran:
            spent = (time.monotonic() - started) / ran
            self.avg_seconds = spent if self.avg_seconds == 0 else 0.5 * (self.avg_seconds + spent)

    def _run_one(self, work: Work) -> bool:
        """Run one job and record its outcome; False if the batch should stop here (a
        retry or a suspended job waits first in ``held``)."""
        run, ledger, f = self.run, self.ledger, work.fields
        job_id, path, raw_payload = f.get(b"j"), f.get(b"h"), f.get(b"p")
        if not job_id or not _JOB_ID.match(job_id) or not path or raw_payload is None:
            ledger.reject(work, f"malformed entry: fields {sorted(k.decode() for k in f)}")
            return True
        jid, body_text = job_id.decode(), raw_payload.decode(errors="replace")
        try:
            payload = from_json(body_text, "field 'p'")
            handler = self._handler(path.decode())
        except (NotJSON, UnicodeDecodeError) as exc:
            ledger.reject(work, f"malformed entry: {exc}")
            return True
        if isinstance(handler, HandlerRefused):
            if self._refuses(handler):
                run.held.appendleft(work)  # handed back, uncharged, as the run leaves
                run.refuse(handler)
                raise Leave("refused")
            ledger.bury(work, jid, time.time(), "handler refused", str(handler), body_text)
            return True
        return self._call(work, jid, handler, payload, body_text)

    def _call(self, work: Work, jid: str, handler: Handler, payload: Any, raw: str) -> bool:
        run, ledger = self.run, self.ledger
        started = time.time()
        if work.attempt == 1 and b"t" in work.fields:
            ledger.latency(started - float(work.fields[b"t"]))
        # settle at least every FLUSH_SECONDS of a batch (not counting the wait for its read)
        if time.monotonic() > max(ledger.last_flush, self.batch_at) + FLUSH_SECONDS:
            ledger.flush()
        try:
            if handler.takes_ctx:
                result = run.watchdog.call(jid, handler.fn, payload, self._context(jid, work))
            else:
                result = run.watchdog.call(jid, handler.fn, payload)
            body = to_json(result, "result")
        except Suspended:  # runs again after the re-rank, same attempt
            run.held.appendleft(work)
            return False
        except NotJSON as exc:
            ledger.bury(work, jid, started, "result is not JSON", str(exc), raw)
            return True
        except ColdStop:
            ledger.interrupted = work.entry_id  # it started: it stays ours, charged
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt...: the handler's own
            retry = ledger.failed(work, jid, started, exc, raw)
            if retry is not None:
                run.held.appendleft(retry)
                return False
            return True
        ledger.succeeded(work, jid, started, body)
        return True

    def _context(self, jid: str, work: Work) -> JobContext:
        run = self.run
        role = run.membership.role
        assert role is not None
        return JobContext(
            queue=run.tk.task_id,
            job_id=jid,
            attempt=work.attempt,
            role=role,
            worker_id=run.me,
            log=run.log,
            _suspend=run.state.suspend,
        )

    def _handler(self, path: str) -> Handler | HandlerRefused:
        """The job's handler, resolved once per path (a refusal too)."""
        found = self.handlers.get(path)
        if found is None:
            try:
                parse_handler_path(path)
                found = resolve(path, self.run.allow)
            except HandlerRefused as exc:
                found = exc
            except ValueError as exc:
                found = HandlerRefused(str(exc), imported=True)
            self.handlers[path] = found
        return found

    @staticmethod
    def _refuses(exc: HandlerRefused) -> bool:
        """This worker's fault (its --allow, its environment), not the job's."""
        return exc.kind == NOT_ALLOWED or not exc.imported

    # -- duties ---------------------------------------------------------------------------

    def _duties(self) -> None:
        """Every ``DUTY_SECONDS``: the run's look around (the queue cancelled? a wedged
        member's jobs?); the leader moves due jobs and reconsiders the queue's demand."""
        self.duties_at = time.monotonic()
        self.run.look_around()
        role = self.run.membership.role
        if role is None or not role.leader:
            self.next_due = None
            return
        self._promote_due()
        if time.monotonic() - self.demand_at >= DEMAND_SECONDS:
            self.demand_at = time.monotonic()
            self._demand()

    def _promote_due(self) -> None:
        run = self.run
        now = time.time()
        pipe = run.r.pipeline(transaction=False)
        pipe.zrangebyscore(run.tk.scheduled, "-inf", now, start=0, num=DUE_BATCH)
        pipe.zrange(run.tk.scheduled, 0, 0, withscores=True)
        due, first = pipe.execute()
        if due:
            moved = run.scripts.promote_due(run.tk, [text(j) for j in due])
            run.log.info("jobs_due", moved=moved)
            self.duties_at = 0.0  # more may be due: look again at once
        self.next_due = float(first[0][1]) if first and not due else None

    def _demand(self) -> None:
        """``want``: no bound while jobs wait unread; ``min_nodes`` once no job finished
        for ``idle_after`` s; else unchanged. Written (with an event) only when it changes."""
        run = self.run
        pipe = run.r.pipeline(transaction=False)
        pipe.xlen(run.tk.stream)
        pipe.xpending(run.tk.stream, run.tk.group)
        pipe.hmget(run.tk.record, ["done", "dead", "want", "min_nodes"])
        length, pending, (done, dead, want, min_nodes) = pipe.execute()
        backlog = int(length) - int(pending["pending"])
        settled = int(done or 0) + int(dead or 0)
        if settled != self.settled_seen[0] or backlog > 0:
            self.settled_seen = (settled, time.monotonic())
        idle = time.monotonic() - self.settled_seen[1] >= self.idle_after
        new = text(want)
        if backlog > 0:
            new = ""  # as many as it may have
        elif idle:
            new = text(min_nodes) or "1"
        if new != text(want):
            pipe = run.r.pipeline(transaction=False)
            pipe.hset(run.tk.record, "want", new)
            events.emit(pipe, run.keys, "demand", task=run.tk.task_id, want=new or "max")
            pipe.execute()
            run.log.info("queue_demand", want=new or "max", backlog=backlog, idle=idle)
