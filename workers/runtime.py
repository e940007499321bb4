"""One worker's run in one task's node set: join, read by role, run handlers, settle, and on
every membership change suspend at a safe point, re-rank, reclaim and resume; leave when
the assignment is revoked, the task finishes, or the worker stops.
"""

from __future__ import annotations

import time
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from queueworks import events
from queueworks.connection import UNAVAILABLE, Connection, text
from queueworks.context import SubtaskContext, Suspended
from queueworks.keys import TaskKeys
from queueworks.membership import Roster, read_roster
from queueworks.messages import BadMessage, NotJSON, Subtask, decode_entry, safe_text, to_json
from queueworks.models import Refusal, Role, StoredSpec, TaskState, describe_error
from queueworks.records import idle_worker, member_of
from queueworks.scripts import (
    READ_EPOCH_MOVED,
    READ_FENCED,
    Claimed,
    DeadEntry,
    Scripts,
    fields_of,
)
from queueworks.signals import ColdStop
from workers.handlers import Handler, HandlerRefused, resolve
from workers.heartbeat import Heartbeat, NodeState
from workers.watchdog import Watchdog

Fields = dict[bytes, bytes]
Entries = list[tuple[bytes, Fields]]  # (entry id, fields) as XREADGROUP returns them
Batches = list[tuple[str, Entries]]  # entries read, by stream

PARKED = "_parked"  # consumer that holds entries handed back by a graceful leave
FLUSH_SECONDS = 0.05  # settle at least this often while a batch runs
TARGET_BATCH_SECONDS = 0.2  # read about this much work at once (fewer for slow handlers)
RECLAIM_BATCH = 500  # XPENDING/XCLAIM batch: large batches stall the server
CHECK_SECONDS = 0.05  # a read re-checks membership and epoch at least this often


@dataclass(slots=True)
class Work:
    stream: str
    entry_id: str
    fields: Fields
    attempt: int  # deliveries so far; the attempt it runs as, once ``charge`` is spent
    charge: bool = False  # may have run before: spend an attempt (XCLAIM) before it starts


class Leave(Exception):
    """Stop working on this task (revoked, finished, stopping)."""


class TaskRun:
    """The life of one worker in one task's node set."""

    def __init__(
        self,
        r: Connection,
        scripts: Scripts,
        tk: TaskKeys,
        state: NodeState,
        heartbeat: Heartbeat,
        watchdog: Watchdog,
        *,
        allow: list[str],
        batch_size: int,
        ttl: float,
        keys: Any,
        log: Any,
    ) -> None:
        self.r, self.scripts, self.tk, self.state, self.hb = r, scripts, tk, state, heartbeat
        self.watchdog = watchdog
        self.allow, self.batch_size, self.ttl_ms = allow, batch_size, int(ttl * 1000)
        self.keys = keys
        self.me = state.worker_id
        self.log = log.bind(task_id=tk.task_id)
        self.role: Role | None = None
        self.local: deque[Work] = deque()
        self.ok: dict[str, list[tuple[str, int, str]]] = {}
        self.dead: dict[str, list[DeadEntry]] = {}
        self.last_flush = time.monotonic()
        self.avg_seconds = 0.0
        self.last_backstop = time.monotonic()
        self.owned: list[str] = []
        self.check_every = min(CHECK_SECONDS, ttl / 10)
        self.checked_at = 0.0  # monotonic time of the last read that checked membership
        self.interrupted: str | None = None  # the entry a cold stop interrupted (not parked)
        self.swept_at = 0.0  # monotonic time of the last look for lost indices
        self.ended = False  # a settle found the task finished: leave at the next check

    # -- entry ----------------------------------------------------------------------------

    def run(self) -> str:
        raw_spec = self.r.hget(self.tk.record, "spec")
        if raw_spec is None:
            return "missing"
        try:
            self.spec = StoredSpec.model_validate_json(raw_spec)
        except ValidationError as exc:
            self._spec_invalid(exc)
            return "finished"
        self.streams = self.tk.streams(self.spec.partitions)
        self.watchdog.use(self.spec.subtask_timeout, self.log)
        try:
            self.handler: Handler = resolve(self.spec.handler, self.allow)
        except HandlerRefused as exc:
            self._refuse(exc)
            return "refused"
        if not self._join():
            return "finished"
        try:
            if self.spec.mode == "step":
                from workers.steps import run_steps  # lockstep mode (queueworks.torch)

                run_steps(self)
            else:
                self._loop()
        except Leave as why:
            return str(why)
        finally:
            self._leave()
        return "finished"  # pragma: no cover - the loop only ends by Leave

    def _spec_invalid(self, exc: ValidationError) -> None:
        """A task record nobody can run (another writer broke it): fail the task, so the
        controller releases its nodes; this worker goes on with the next one."""
        error = f"stored spec is invalid: {describe_error(exc)}"
        if self.scripts.set_state(self.tk, TaskState.FAILED, time.time(), error):
            events.emit(self.r, self.keys, "failed", task=self.tk.task_id, error=error)
        self.log.error("spec_invalid", error=error)

    def _refuse(self, exc: HandlerRefused) -> None:
        """This worker cannot run the task's handler: say so instead of joining (and
        dead-lettering everything it would read); the controller gives the task to others."""
        refusal = Refusal(reason=str(exc), kind=exc.kind, since=self.state.started_at)
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.tk.refused, self.me, refusal.model_dump_json())
        events.emit(pipe, self.keys, "refused", task=self.tk.task_id, worker=self.me)
        pipe.execute()
        self.log.warning("handler_refused", reason=refusal.reason, kind=refusal.kind)

    def _join(self) -> bool:
        self.state.suspend.clear()
        self.state.fenced = False
        epoch = self.scripts.join(self.tk, self.me, self.ttl_ms, time.time())
        if epoch < 0:
            return False
        self.state.role_epoch = self.state.epoch_seen = epoch  # epochs are per task
        self.state.task_id = self.tk.task_id
        self.log.info("joined", epoch=epoch)
        # The re-rank reads the roster one round trip after the join: members assigned
        # together join within a millisecond, and a later read often sees them all (one
        # re-rank, not two).
        self._rerank()
        self.hb.poke()
        return True

    def _leave(self) -> None:
        """Settle what is done, hand back what is not, leave: the others rebalance at once."""
        self.state.suspend.set()
        try:
            self._flush()
            self._hand_back(self.streams)
            self._flush()  # dead letters for entries found gone
            self.state.task_id = None
            epoch = self.scripts.depart(self.tk, self.me, time.time(), "leave", only_if_dead=False)
            self.r.hset(self.keys.worker(self.me), mapping=idle_worker())
            if epoch:
                events.emit(self.r, self.keys, "member_left", task=self.tk.task_id, worker=self.me)
            self.log.info("left", epoch=epoch)
        except UNAVAILABLE as exc:
            self.state.task_id = None
            self.log.warning("leave_failed", error=str(exc))

    # -- the loop -------------------------------------------------------------------------

    def _check(self) -> None:
        s = self.state
        if s.stopping:
            raise Leave("stopping")
        if s.assign != self.tk.task_id:
            raise Leave("revoked")
        if self.ended:
            raise Leave("finished")
        if s.fenced:
            self._flush()
            self.log.warning("fenced", reason="heartbeat gone: pruned while away; rejoining")
            self._hand_back(self.streams)  # what the others have not reclaimed yet
            if not self._join():
                raise Leave("finished")
        if s.suspend.is_set():
            self._rerank()

    def _loop(self) -> None:
        while True:
            self._check()
            if self.local:
                self._run_local()
                continue
            read = self._read_partitions() if self.spec.partitions else self._read()
            if read is None:
                self._idle()
            elif read:
                self._run_fresh(read)

    def _read(self) -> Batches | None:
        """Dynamic tasks: read new entries with native XREADGROUP (about 2x cheaper than
        reading inside Lua), pipelined behind the member check and the epoch in one round
        trip when the last check is older than ``check_every``.

        That keeps the fence: a member is pruned only after its heartbeat has been gone a
        whole TTL, so a member back from a pause or a partition has not checked for longer
        than ``check_every`` (a tenth of the TTL at most) and checks before it runs anything
        it reads; a fenced member runs nothing it read: ``_check`` parks it all (no attempt
        spent). A prune landing between two checks is caught by the next check or heartbeat
        tick, as for any member pruned while it holds entries; an epoch change reaches us
        through the watcher first, this check is the fallback when notifications are off.
        After an epoch change the entries stay ours and run after the re-rank.

        Returns what was read, by stream; None if nothing was read and nothing changed."""
        assert self.role is not None
        read: dict[Any, Any] = {self.tk.stream: ">"}
        now = time.monotonic()
        changed = False
        reply: Any
        if now - self.checked_at < self.check_every:
            reply = self.r.xreadgroup(self.tk.group, self.me, read, count=self._read_count())
        else:
            pipe = self.r.pipeline(transaction=False)
            pipe.zscore(self.tk.members, self.me)
            pipe.get(self.tk.epoch)
            pipe.xreadgroup(self.tk.group, self.me, read, count=self._read_count())
            score, epoch, reply = pipe.execute()
            self.checked_at = now
            changed = score is None or int(epoch or 0) != self.role.epoch
            if score is None:
                self.state.fenced = True
            elif changed:
                self.state.observe_epoch(int(epoch or 0))
        if not reply:
            return [] if changed else None
        return [(text(stream), entries) for stream, entries in reply]

    def _read_partitions(self) -> Batches | None:
        """Partitioned tasks: read inside Lua, fenced, so no partition is ever read by two
        members in one epoch (a stale member reads nothing at all)."""
        assert self.role is not None
        status, reply = self.scripts.fenced_read(
            self.tk, self.owned, self.me, self._read_count(), self.role.epoch
        )
        if status == READ_FENCED:
            self.state.fenced = True
        elif status == READ_EPOCH_MOVED:
            self.state.observe_epoch(int(reply))
        elif status == 1:
            return [
                (text(stream), [(eid, fields_of(flat)) for eid, flat in entries])
                for stream, entries in reply
            ]
        return None if status == 0 else []

    def _idle(self) -> None:
        self._flush()
        state = self.r.hget(self.tk.record, "state")
        if state is None or TaskState(text(state)).finished:
            raise Leave("finished")
        if time.monotonic() - self.last_backstop > min(self.spec.subtask_timeout / 2, 5.0):
            self.last_backstop = time.monotonic()
            self._reclaim(backstop=True)
            if self.local:
                return
        assert self.role is not None
        if self.role.leader and time.monotonic() - self.swept_at > self.hb.interval:
            self._sweep_lost()
        self.state.wake.wait(self.hb.interval)
        self.state.wake.clear()

    def _read_count(self) -> int:
        if self.avg_seconds <= 0:  # pace unknown: take one, so slow subtasks spread out
            return 1
        return max(1, min(self.batch_size, int(TARGET_BATCH_SECONDS / self.avg_seconds)))

    def _run_fresh(self, read: Batches) -> None:
        """Run entries just read (first delivery: nothing to charge, attempt 1) until done
        or a safe point says stop; what is left waits in ``local``, in order."""
        ran, started = 0, time.monotonic()
        for n, (stream, entries) in enumerate(read):
            done = self._run_entries(stream, entries, 1)
            ran += done
            if done < len(entries):
                for rest_stream, rest in [(stream, entries[done:]), *read[n + 1 :]]:
                    self.local.extend(Work(rest_stream, eid.decode(), f, 1) for eid, f in rest)
                break
        self._ran(ran, started)

    def _run_local(self) -> None:
        """Run the entries in hand (reclaimed, retried, kept at a safe point) until done or
        a safe point says stop."""
        s = self.state
        ran, started = 0, time.monotonic()
        while self.local:
            if s.suspend.is_set() or s.stopping or s.fenced:
                break
            work = self._start(self.local.popleft())
            if work is None:
                continue
            # (the id back to bytes, as read: the rare path shares the hot one)
            if not self._run_entries(
                work.stream, [(work.entry_id.encode(), work.fields)], work.attempt
            ):
                self.local.appendleft(work)  # stopped at a safe point: same attempt
                break
            ran += 1
        self._ran(ran, started)

    def _run_entries(self, stream: str, entries: Entries, attempt: int) -> int:
        """Run entries of one stream in order and record each outcome for the next settle,
        until done or a safe point says stop. Returns how many were consumed; the rest (a
        suspended one first) is the caller's to keep, in order. A failure that will be
        retried ends the run too: the retry waits first in ``local``, so it runs before
        anything later in the stream (per-key order).

        This is the hot path: what every entry needs is looked up once per call, and a
        ``Work`` is only built on the rare paths that keep or bury an entry."""
        s = self.state
        suspended = s.suspend.is_set
        monotonic = time.monotonic
        call = self.watchdog.call
        fn, takes_ctx = self.handler.fn, self.handler.takes_ctx
        ok = self.ok.setdefault(stream, [])
        flush_at = self.last_flush + FLUSH_SECONDS
        for i, (raw_id, fields) in enumerate(entries):
            if suspended() or s.stopping or s.fenced:
                return i
            if monotonic() > flush_at:
                self._flush()
                ok = self.ok.setdefault(stream, [])
                flush_at = self.last_flush + FLUSH_SECONDS
            entry_id = raw_id.decode()
            try:
                sub = decode_entry(entry_id, fields)
            except BadMessage as exc:
                work = Work(stream, entry_id, fields, attempt)
                self._bury(work, None, "malformed entry", str(exc))
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
                self._bury(work, sub.index, "result is not JSON", str(exc), sub.raw_payload)
                continue
            except ColdStop:
                self.interrupted = entry_id  # it started: it stays ours, charged, for reclaim
                raise
            except BaseException as exc:  # SystemExit, KeyboardInterrupt...: the handler's own
                work = Work(stream, entry_id, fields, attempt)
                if self._failed(work, sub.index, exc, sub.raw_payload):
                    return i + 1
                continue
            ok.append((entry_id, sub.index, body))
        return len(entries)

    def _context(self, sub: Subtask, attempt: int) -> SubtaskContext:
        assert self.role is not None
        return SubtaskContext(
            task_id=self.tk.task_id,
            index=sub.index,
            attempt=attempt,
            role=self.role,
            worker_id=self.me,
            log=self.log,
            key=sub.key,
            _suspend=self.state.suspend,
        )

    def _ran(self, ran: int, started: float) -> None:
        """Settle, and let the read size follow the handler's pace (~TARGET_BATCH_SECONDS
        of work per read)."""
        if ran:
            spent = (time.monotonic() - started) / ran
            self.avg_seconds = spent if self.avg_seconds == 0 else 0.5 * (self.avg_seconds + spent)
        self._flush()

    def _start(self, work: Work) -> Work | None:
        """The entry as it may run now, or None (dead-lettered, or no longer ours).

        An entry that may have run before (reclaimed, adopted) is charged here, when it
        starts, not when it was claimed: a worker that dies charges only the entry it was
        running, never the ones it merely held. Everything done is settled first, so if
        this entry kills the process, nothing else runs again."""
        if work.charge:
            work = Work(work.stream, work.entry_id, work.fields, work.attempt + 1)
            if work.attempt <= self.spec.max_attempts:
                self._flush()
                if not self.r.xclaim(work.stream, self.tk.group, self.me, 0, [work.entry_id]):
                    return None  # settled meanwhile (a slow runner finished it)
        if work.attempt > self.spec.max_attempts:
            starts = work.attempt - 1
            why = (
                f"started {starts} times without finishing (max_attempts="
                f"{self.spec.max_attempts}): each time its worker died or hung"
            )
            spent = Work(work.stream, work.entry_id, work.fields, starts)
            self._bury(spent, _index_of(work), "exceeded max_attempts", why)
            return None
        return work

    def _failed(self, work: Work, index: int, exc: BaseException, payload: str) -> bool:
        """A handler raised: dead-letter it after ``max_attempts``, else spend an attempt and
        queue the retry first in ``local`` (True)."""
        tb = "".join(traceback.format_exception(exc))
        if work.attempt >= self.spec.max_attempts:
            self._bury(work, index, f"failed {work.attempt} times", tb, payload)
            return False
        self.log.info("subtask_retry", index=index, attempt=work.attempt, error=repr(exc))
        # XCLAIM to ourselves raises the delivery count: the attempt is spent in Redis too.
        if not self.r.xclaim(work.stream, self.tk.group, self.me, 0, [work.entry_id]):
            return False  # no longer ours (reclaimed by the others meanwhile)
        # retried at once, before anything later in the stream (per-key order)
        self.local.appendleft(Work(work.stream, work.entry_id, work.fields, work.attempt + 1))
        return True

    def _bury(
        self, work: Work, index: int | None, reason: str, error: str, payload: str | None = None
    ) -> None:
        if payload is None:
            payload = safe_text(work.fields.get(b"p"))
        entry = DeadEntry(work.entry_id, index, reason, error[-8000:], work.attempt, payload)
        self.dead.setdefault(work.stream, []).append(entry)
        self.log.warning("dead_lettered", index=index, reason=reason, attempts=work.attempt)

    def _bury_gone(self, stream: str, entry_id: str, deliveries: int) -> None:
        """A pending entry whose payload was deleted or trimmed: dead-letter it, so the
        task's count still adds up."""
        self._bury(
            Work(stream, entry_id, {}, deliveries),
            None,
            "payload gone",
            "entry deleted or trimmed while pending",
        )

    def _flush(self) -> None:
        """Settle everything done: one atomic step per stream (ack, results, dead letters,
        counts), and the events that follow from it."""
        self.last_flush = time.monotonic()
        settled_n = sum(map(len, self.ok.values())) + sum(map(len, self.dead.values()))
        if not settled_n:
            return
        now = time.time()
        finished = False
        self.state.processed += settled_n
        for stream in {*self.ok, *self.dead}:
            if not self.ok.get(stream) and not self.dead.get(stream):
                continue
            settled = self.scripts.settle(
                self.tk, stream, self.me, now, self.ok.get(stream, ()), self.dead.get(stream, ())
            )
            finished = finished or settled.finished
            self.ended = self.ended or not settled.active
            if settled.rejected:
                self.log.warning("entries_rejected", stream=stream, count=settled.rejected)
        had_dead = any(self.dead.values())
        self.ok.clear()
        self.dead.clear()
        if had_dead:
            events.emit(self.r, self.keys, "dead_lettered", task=self.tk.task_id)
        if finished:
            self._finished()

    def _finished(self) -> None:
        """This worker's settle finished the task: say how it ended."""
        status = self.r.hget(self.tk.record, "state")
        kind = text(status) or "completed"
        self.log.info("task_finished", state=kind)
        events.emit(self.r, self.keys, kind, task=self.tk.task_id)

    def _sweep_lost(self) -> None:
        """The leader, idle: if nothing of the task is in flight, dead-letter the indices no
        entry is left for (deleted from the stream), so the task can complete by index."""
        self.swept_at = time.monotonic()
        lost = self.scripts.sweep_lost(self.tk, self.streams, self.me, time.time())
        if lost:
            self.log.warning("subtasks_lost", count=lost, reason="stream entries deleted")
            events.emit(self.r, self.keys, "dead_lettered", task=self.tk.task_id)
            if self.scripts.settle(self.tk, self.streams[0], self.me, time.time(), []).finished:
                self._finished()

    # -- membership changes ---------------------------------------------------------------

    def _rerank(self) -> None:
        """Suspend (flush), take the new role, hand back/reclaim as the role says."""
        self._flush()
        paused = time.monotonic()
        while True:
            self.state.suspend.clear()
            roster = read_roster(self.r, self.tk)
            role = roster.role_of(self.me)
            if role is None:
                self.state.fenced = True
                return
            self.state.role_epoch = roster.epoch
            old, self.role = self.role, role
            if self.spec.partitions:
                if not self._barrier(roster):
                    continue  # the set changed again while we waited: start over
            else:
                self.owned = self.streams
            if self.state.epoch_seen <= roster.epoch:
                break
        s = self.state
        if s.epoch_seen <= s.role_epoch and not (
            s.stopping or s.fenced or s.assign != self.tk.task_id
        ):
            s.suspend.clear()  # a wake-up for the epoch we just took is stale
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(
            self.keys.worker(self.me), mapping=member_of(self.tk.task_id, role.rank, role.epoch)
        )
        if role.leader:  # the membership change this rebalance answers, for the history
            pipe.xrevrange(self.tk.history, count=1)
        replies = pipe.execute()
        reclaimed = 0
        if self.spec.partitions or role.leader or old is None:
            reclaimed = self._reclaim(
                backstop=False,
                departed=bool(self.spec.partitions) or role.leader,
                adopt=old is None,
                members=roster.members,
            )
        pause_ms = round((time.monotonic() - paused) * 1000, 1)
        self.log.info(
            "rebalanced",
            rank=role.rank,
            world_size=role.world_size,
            epoch=role.epoch,
            old_rank=old.rank if old else None,
            pause_ms=pause_ms,
        )
        if role.leader:
            self._record_rebalance(role, pause_ms, reclaimed, replies[1])
        if self.handler.on_rebalance is not None and old != role:
            self.handler.on_rebalance(old, role)

    def _record_rebalance(self, role: Role, pause_ms: float, reclaimed: int, last: Any) -> None:
        """The leader writes one history entry per rebalance: how long the members paused,
        what was reclaimed, and how long after the membership change (``last``, the latest
        history entry when the rebalance began) it was all done."""
        now = time.time()
        since_change_ms = ""
        if last and last[0][1].get(b"cause") != b"rebalanced":
            since_change_ms = str(round((now - float(last[0][1][b"ts"])) * 1000, 1))
        self.r.xadd(
            self.tk.history,
            {
                "epoch": role.epoch,
                "cause": "rebalanced",
                "size": role.world_size,
                "pause_ms": pause_ms,
                "reclaimed": reclaimed,
                "since_change_ms": since_change_ms,
                "ts": repr(now),
            },
            maxlen=1000,
            approximate=True,
        )

    def _barrier(self, roster: Roster) -> bool:
        """Partitioned tasks: give up partitions we no longer own, confirm the epoch, and wait
        until every member has, so no partition is read by two members in one epoch."""
        assert self.role is not None
        n, rank = self.role.world_size, self.role.rank
        self.owned = [s for k, s in enumerate(self.streams) if k % n == rank]
        self._hand_back([s for s in self.streams if s not in self.owned])
        self.r.hset(self.tk.confirm, self.me, roster.epoch)
        while True:
            confirmed = self.r.hmget(self.tk.confirm, list(roster.members))
            if all(c is not None and int(c) >= roster.epoch for c in confirmed):
                return True
            if self.state.epoch_seen > roster.epoch or self.state.fenced:
                return False
            if self.state.stopping or self.state.assign != self.tk.task_id:
                return True  # leaving anyway; _check raises Leave next
            self.state.wake.wait(0.01)
            self.state.wake.clear()
            self.state.observe_epoch(int(self.r.get(self.tk.epoch) or 0))

    def _hand_back(self, streams: list[str]) -> None:
        """Park every entry we still hold in ``streams`` (JUSTID: no attempt spent); the
        partition's owner, or the leader, takes them back. Only entries still ours move,
        so nothing a reclaimer already took is stolen back."""
        for stream in streams:
            while True:
                claimed, gone = self.scripts.reclaim(
                    self.tk,
                    stream,
                    PARKED,
                    from_consumer=self.me,
                    hand_back=True,
                    only_departed=False,
                    keep=self.interrupted or "",
                )
                for entry_id, deliveries in gone:
                    self._bury_gone(stream, entry_id, deliveries)
                if not claimed or len(claimed) + len(gone) < RECLAIM_BATCH:
                    break
        self.local = deque(w for w in self.local if w.stream not in streams)

    def _own_pending(self, stream: str) -> list[Claimed]:
        """Entries still pending on our own consumer (read, never settled)."""
        out: list[Claimed] = []
        start = "-"
        while True:
            pending: Any = self.r.xpending_range(
                stream, self.tk.group, start, "+", RECLAIM_BATCH, consumername=self.me
            )
            if not pending:
                return out
            pipe = self.r.pipeline(transaction=False)
            for p in pending:
                pipe.xrange(stream, p["message_id"], p["message_id"])
            for p, entry in zip(pending, pipe.execute(), strict=True):
                fields = entry[0][1] if entry else {}
                out.append(Claimed(text(p["message_id"]), fields, int(p["times_delivered"])))
            if len(pending) < RECLAIM_BATCH:
                return out
            start = "(" + text(pending[-1]["message_id"])

    def _reclaim(
        self,
        *,
        backstop: bool,
        departed: bool = True,
        adopt: bool = False,
        members: Sequence[str] | None = None,
    ) -> int:
        """Claim what departed members left pending (at once), what was parked, or — as a
        backstop — what a wedged member holds past the watchdog's hard limit. With
        ``adopt`` (on joining), also take back our own pending entries from an earlier
        life of this worker (a lost connection, a Redis restart that lost acks, a restart
        under the same name).

        Claims spend no attempt (JUSTID). What may have run before is charged when it
        starts again (``_start``); parked entries never ran and are not charged.

        ``members``: the roster just read, if any (it only narrows which consumers to try:
        the reclaim script checks membership itself, atomically)."""
        if departed and not backstop and members is None:
            members = read_roster(self.r, self.tk).members
        current = set(members or ())
        claimed_total = 0
        for stream in self.owned:
            # (claimed, payload gone, charge when it starts)
            batches: list[tuple[list[Claimed], list[tuple[str, int]], bool]] = []
            if backstop:
                # idle past the hard limit and a TTL: its holder should have exited and
                # been pruned by now, yet it is still a member
                wd = self.watchdog
                idle_ms = int((wd.timeout + wd.grace) * 1000) + self.ttl_ms
                claimed, gone = self.scripts.reclaim(
                    self.tk,
                    stream,
                    self.me,
                    min_idle_ms=idle_ms,
                    hand_back=True,
                    only_departed=False,
                )
                batches.append((claimed, gone, True))
            elif adopt or departed:
                # one look at the group's consumers tells whose entries to claim, ours too
                for info in self.r.xinfo_consumers(stream, self.tk.group):
                    name = text(info["name"])
                    if name == self.me:
                        if adopt and info["pending"]:
                            batches.append((self._own_pending(stream), [], True))
                        continue
                    if not departed or name in current:
                        continue
                    parked = name == PARKED
                    while True:
                        claimed, gone = self.scripts.reclaim(
                            self.tk,
                            stream,
                            self.me,
                            from_consumer=name,
                            hand_back=True,
                            only_departed=not parked,
                        )
                        batches.append((claimed, gone, not parked))
                        if not claimed or len(claimed) + len(gone) < RECLAIM_BATCH:
                            break
            found = []
            for claimed, gone, charge in batches:
                for c in claimed:
                    found.append(Work(stream, c.entry_id, c.fields, c.deliveries, charge))
                for entry_id, deliveries in gone:
                    self._bury_gone(stream, entry_id, deliveries)
            found = _dedupe(sorted(found, key=lambda w: _id_key(w.entry_id)))
            claimed_total += len(found)
            self.local.extendleft(reversed(found))
        if claimed_total:
            self.log.info("reclaimed", entries=claimed_total, backstop=backstop)
        self._flush()
        return claimed_total


def _index_of(work: Work) -> int | None:
    try:
        return decode_entry(work.entry_id, work.fields).index
    except BadMessage:
        return None


def _dedupe(works: list[Work]) -> list[Work]:
    seen: set[str] = set()
    out = []
    for w in works:
        if w.entry_id not in seen:
            seen.add(w.entry_id)
            out.append(w)
    return out


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
