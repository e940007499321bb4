"""Subtask mode (the default): read entries by role, run the handler on each, record the
outcome for the next settle; a retry runs before anything later in its stream, or, with a
retry delay (``TaskSpec.retry_delay``), waits for its time while the member runs the
others (``workers.retry_wait``; a partitioned task's retries run at once: per-key order)."""

from __future__ import annotations

import time
from typing import Any

from queueworks.context import SubtaskContext, Suspended
from queueworks.errors import NotJSON
from queueworks.process import ColdStop
from queueworks.protocol.messages import BadMessage, Subtask, decode_subtask, text, to_json
from queueworks.protocol.records import TASK_TRACE
from queueworks.protocol.retry_policy import RetryPolicy
from queueworks.scripts.bound import READ_EPOCH_MOVED, READ_FENCED, fields_of
from queueworks.tracing import hooks

from .concurrent import Concurrently
from .inflight import Call, InFlight, is_async
from .ledger import Ledger
from .loop import Run
from .retry_wait import WaitingRetries
from .work import Batches, Entries, Work

FLUSH_SECONDS = 0.05  # settle at least this often while a batch runs
TARGET_BATCH_SECONDS = 0.2  # read about this much work at once (fewer for slow handlers)
CHECK_SECONDS = 0.05  # a read re-checks membership and epoch at least this often
IDLE_SECONDS = 1.0  # idle, a member waits at most this long (a heartbeat) unless a retry is due


class SubtaskLoop:
    def __init__(self, run: Run) -> None:
        assert run.handler is not None
        self.run, self.handler = run, run.handler
        self.ledger = Ledger(run.r, run.scripts, run.tk, run.keys, run.spec, run.state, run.log)
        self.flight = (
            InFlight(run.concurrency, run.aio, run.watchdog) if run.concurrency > 1 else None
        )
        # one at a time, the safe point right after a settle leaves once the task ended:
        # the end's event rides with the leave (many in flight drain first: not held)
        self.ledger.hold_end = self.flight is None
        self.avg_seconds = 0.0
        self.check_every = min(CHECK_SECONDS, run.membership.ttl_ms / 10_000)
        spec = run.spec
        self.retries = RetryPolicy(spec.retry_delay, spec.retry_backoff, spec.retry_max_delay)
        self.waiting = WaitingRetries(run)
        self.trace: str | None = None  # the task's trace context, while tracing

    def serve(self) -> None:
        run = self.run
        if self.flight is not None:
            timeout = run.spec.subtask_timeout
            Concurrently(run, self.ledger, self, self.flight, timeout).serve()
        while True:
            run.check()
            self.waiting.tick()
            if run.held:
                self._run_held()
                continue
            read = self._read_partitions() if run.spec.partitions else self._read()
            if read is None:
                self.idle()
            elif read:
                self._run_fresh(read)

    def close(self, reason: str) -> None:
        """Retries waiting here are forgotten: the run hands them back with what it holds."""
        self.waiting.clear()

    def _waits(self, retry: Work) -> bool:
        """Whether the retry of a failed subtask waits for its time (it is then kept by
        ``waiting``); False: it runs at once (no delay, or a partitioned task)."""
        if self.run.spec.partitions:
            return False
        wait = self.retries.wait(retry.attempt - 1)
        if wait <= 0:
            return False
        self.waiting.add(retry, wait)
        self.run.log.info("subtask_retry_later", entry=retry.entry_id, wait=round(wait, 3))
        return True

    def join_read(self) -> int:
        """A dynamic task's first entries come with the join (``workers.loop.ReadsAtJoin``);
        a partitioned one's wait for the role (it says which partitions are ours), and
        many in flight read for themselves."""
        if self.run.spec.partitions or self.flight is not None:
            return 0
        return self._read_count()

    # -- reading --------------------------------------------------------------------------

    def _read(self, count: int | None = None) -> Batches | None:
        """Dynamic tasks: read new entries with native XREADGROUP (about 2x cheaper than
        reading inside Lua), pipelined behind the member check and the epoch in one round
        trip when the last check is older than ``check_every``.

        That keeps the fence: a member is pruned only after its heartbeat has been gone a
        whole TTL, so a member back from a pause or a partition has not checked for longer
        than ``check_every`` (a tenth of the TTL at most) and checks before it runs anything
        it reads; a fenced member runs nothing it read: the check parks it all (no attempt
        spent). A prune landing between two checks is caught by the next check or heartbeat
        tick, as for any member pruned while it holds entries; an epoch change reaches us
        through the watcher first, this check is the fallback when notifications are off.
        After an epoch change the entries stay ours and run after the re-rank.

        Returns what was read, by stream; None if nothing was read and nothing changed."""
        run = self.run
        read: dict[Any, Any] = {run.tk.stream: ">"}
        now = time.monotonic()
        changed = False
        reply: Any
        if now - run.membership.checked_at < self.check_every:  # (a join, a re-rank count)
            reply = run.r.xreadgroup(run.tk.group, run.me, read, count=count or self._read_count())
        else:
            pipe = run.r.pipeline(transaction=False)
            pipe.zscore(run.tk.members, run.me)
            pipe.get(run.tk.epoch)
            pipe.xreadgroup(run.tk.group, run.me, read, count=count or self._read_count())
            score, epoch, reply = pipe.execute()
            changed = run.membership.fence(score, epoch, now)
        if not reply:
            return [] if changed else None
        return [(text(stream), entries) for stream, entries in reply]

    def _read_partitions(self, count: int | None = None) -> Batches | None:
        """Partitioned tasks: read inside Lua, fenced, so no partition is ever read by two
        members in one epoch (a stale member reads nothing at all)."""
        run = self.run
        role = run.membership.role
        assert role is not None
        status, reply = run.scripts.fenced_read(
            run.tk, run.owned, run.me, count or self._read_count(), role.epoch
        )
        if status == READ_FENCED:
            run.state.fenced = True
        elif status == READ_EPOCH_MOVED:
            run.state.observe_epoch(int(reply))
        elif status == 1:
            return [
                (text(stream), [(eid, fields_of(flat)) for eid, flat in entries])
                for stream, entries in reply
            ]
        return None if status == 0 else []

    def _read_count(self) -> int:
        if self.avg_seconds <= 0:  # pace unknown: take one, so slow subtasks spread out
            return 1
        return max(1, min(self.run.batch_size, int(TARGET_BATCH_SECONDS / self.avg_seconds)))

    # -- running --------------------------------------------------------------------------

    def _run_fresh(self, read: Batches) -> None:
        """Run entries just read (first delivery: nothing to charge, attempt 1) until done
        or a safe point says stop; what is left waits in ``held``, in order."""
        ran, started = 0, time.monotonic()
        for n, (stream, entries) in enumerate(read):
            done = self._run_entries(stream, entries, 1)
            ran += done
            if done < len(entries):
                for rest_stream, rest in [(stream, entries[done:]), *read[n + 1 :]]:
                    self.run.held.extend(Work(rest_stream, eid.decode(), f, 1) for eid, f in rest)
                break
        self._ran(ran, started)

    def _run_held(self) -> None:
        """Run the entries in hand (reclaimed, retried, kept at a safe point) until done or
        a safe point says stop."""
        run = self.run
        s = run.state
        ran, started = 0, time.monotonic()
        while run.held:
            if s.suspend.is_set() or s.stopping or s.fenced:
                break
            work = self.ledger.start(run.held.popleft())
            if work is None:
                continue
            # (the id back to bytes, as read: the rare path shares the hot one)
            if not self._run_entries(
                work.stream, [(work.entry_id.encode(), work.fields)], work.attempt
            ):
                run.held.appendleft(work)  # stopped at a safe point: same attempt
                break
            ran += 1
        self._ran(ran, started)

    def _run_entries(self, stream: str, entries: Entries, attempt: int) -> int:
        """``_run_each``; while tracing, in one ``process`` span (``messaging.batch.
        message_count``: the entries run), a child of the submit's ``send`` span."""
        tracer = hooks.consumer
        if tracer is None:
            return self._run_each(stream, entries, attempt)
        if self.trace is None:  # the task's trace context, read once
            self.trace = text(self.run.r.hget(self.run.tk.record, TASK_TRACE) or b"")
        run = self.run
        fn = tracer.subtask_fn(self.handler.fn, run.spec.name)  # None: no span per subtask
        with tracer.batch(run.spec.name, self.trace, len(entries), run.me) as span:
            span.set_attribute("queueworks.task.id", run.tk.task_id)
            ran = self._run_each(stream, entries, attempt, fn)
            span.set_attribute("messaging.batch.message_count", ran)
        return ran

    def _run_each(self, stream: str, entries: Entries, attempt: int, traced: Any = None) -> int:
        """Run entries of one stream in order and record each outcome for the next settle,
        until done or a safe point says stop. Returns how many were consumed; the rest (a
        suspended one first) is the caller's to keep, in order. A failure that will be
        retried ends the run too: the retry waits first in ``held``, so it runs before
        anything later in the stream (per-key order).

        This is the hot path: what every entry needs is looked up once per call, and a
        ``Work`` is only built on the rare paths that keep or bury an entry."""
        run, ledger = self.run, self.ledger
        s = run.state
        suspended = s.suspend.is_set
        monotonic = time.monotonic
        call = run.watchdog.call if not is_async(self.handler.fn) else self._await
        fn, takes_ctx = traced or self.handler.fn, self.handler.takes_ctx
        ok = ledger.succeeded(stream)
        flush_at = ledger.last_flush + FLUSH_SECONDS
        for i, (raw_id, fields) in enumerate(entries):
            if suspended() or s.stopping or s.fenced:
                return i
            if monotonic() > flush_at:
                ledger.flush()
                ok = ledger.succeeded(stream)
                flush_at = ledger.last_flush + FLUSH_SECONDS
            entry_id = raw_id.decode()
            try:
                sub = decode_subtask(entry_id, fields)
            except BadMessage as exc:
                work = Work(stream, entry_id, fields, attempt)
                ledger.bury(work, None, "malformed entry", str(exc))
                continue
            try:
                if takes_ctx:
                    result = call(sub.index, fn, sub.payload, self._context(sub, attempt))
                else:
                    result = call(sub.index, fn, sub.payload)
                body = to_json(result, "result")
            except Suspended:  # runs again after the re-rank, same attempt
                return i
            except NotJSON as exc:
                work = Work(stream, entry_id, fields, attempt)
                ledger.bury(work, sub.index, "result is not JSON", str(exc), sub.raw_payload)
                continue
            except ColdStop:
                ledger.interrupted.add(entry_id)  # it started: it stays ours, charged
                raise
            except BaseException as exc:  # SystemExit, KeyboardInterrupt...: the handler's own
                retry = ledger.failed(
                    Work(stream, entry_id, fields, attempt), sub.index, exc, sub.raw_payload
                )
                if retry is not None and not self._waits(retry):
                    run.held.appendleft(retry)  # at once, before anything later in the stream
                    return i + 1
                continue
            ok.append((entry_id, sub.index, body))
        return len(entries)

    def _await(self, index: int, fn: Any, *args: Any) -> Any:
        """An ``async def`` handler at concurrency 1: on the event loop, waited for here."""
        return self.run.aio.run(index, fn, args, self.run.spec.subtask_timeout)

    # -- many in flight (--concurrency > 1): workers.concurrent.Items -----------------------

    def read(self, count: int, block: bool) -> list[Work] | None:
        run = self.run
        read = self._read_partitions(count) if run.spec.partitions else self._read(count)
        if read is None:
            return None
        return [Work(stream, eid.decode(), f, 1) for stream, entries in read for eid, f in entries]

    def key_of(self, work: Work) -> str | None:
        key = work.fields.get(b"k") if self.run.spec.partitions else None
        return key.decode(errors="replace") if key is not None else None

    def call_for(self, work: Work) -> Call | None:
        try:
            sub = decode_subtask(work.entry_id, work.fields)
        except BadMessage as exc:
            self.ledger.bury(work, None, "malformed entry", str(exc))
            return None
        args: tuple[Any, ...] = (sub.payload,)
        if self.handler.takes_ctx:
            args = (sub.payload, self._context(sub, work.attempt))
        return Call(work, sub.index, self.handler.fn, args, key=sub.key, extra=sub)

    def record(self, call: Call) -> None:
        work, sub, ledger = call.item, call.extra, self.ledger
        if call.error is None:
            try:
                body = to_json(call.value, "result")
            except NotJSON as exc:
                ledger.bury(work, sub.index, "result is not JSON", str(exc), sub.raw_payload)
                return
            ledger.succeeded(work.stream).append((work.entry_id, sub.index, body))
        elif isinstance(call.error, Suspended):
            self.run.held.appendleft(work)  # runs again after the re-rank, same attempt
        else:
            retry = ledger.failed(work, sub.index, call.error, sub.raw_payload)
            if retry is not None and not self._waits(retry):
                self.run.held.appendleft(retry)

    def tick(self) -> None:
        """Retries that waited for their time and are due go in hand."""
        self.waiting.tick()

    def idle(self) -> None:
        """Nothing read: wait (not past the first waiting retry's time)."""
        run = self.run
        if not self.waiting or self.waiting.seconds_left() > IDLE_SECONDS:
            run.idle()
            return
        run.look_around()
        if not run.held:
            run.state.wake.wait(self.waiting.seconds_left())
            run.state.wake.clear()

    def _context(self, sub: Subtask, attempt: int) -> SubtaskContext:
        run = self.run
        role = run.membership.role
        assert role is not None
        return SubtaskContext(
            task_id=run.tk.task_id,
            index=sub.index,
            attempt=attempt,
            role=role,
            worker_id=run.me,
            log=run.log,
            key=sub.key,
            _suspend=run.state.suspend,
        )

    def _ran(self, ran: int, started: float) -> None:
        """Settle, and let the read size follow the handler's pace (~TARGET_BATCH_SECONDS
        of work per read)."""
        if ran:
            spent = (time.monotonic() - started) / ran
            self.avg_seconds = spent if self.avg_seconds == 0 else 0.5 * (self.avg_seconds + spent)
        self.ledger.flush()
