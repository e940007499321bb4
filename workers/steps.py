"""Lockstep mode (``TaskSpec(mode="step")``): every member of the node set runs each step
together, for data-parallel training that keeps going while the node set changes.

This module knows streams and membership, not any framework: it never imports torch. The
trainer it drives follows the step contract in ``queueworks.steps`` (``StepTrainer``,
``StepContext``, ``Generation``, ``StepInfo``, ``StepAborted``).

**One step.** Each member takes at most one shard: one it holds (an aborted step's, or
reclaimed), else one parked, else a new one (fenced by membership and epoch). It records the
shard in the task's ``steps`` hash, runs ``prepare`` and ``reduce``, and proposes a decision:
``commit`` if its collective completed, ``abort`` if not. The first proposal stored for the
step wins (HSETNX, fenced by membership), and every member follows it:

* A completed all-reduce on any member proves every member entered it, so every shard of
  the step is recorded and every contribution arrived: committing is correct even if a peer
  died right after. A departure that breaks the collective aborts the step; a join does not
  (the joiner is not in the step), it only starts a new generation after it.
* Commit: each member settles its own shard (ack + result, counted once). The others'
  shards are kept and settled too if the next collective fails, before any re-rank, so a
  member that died between commit and ack never has its shard reclaimed and run again.
* Abort: the shard stays in hand (``run.held``): no attempt spent. A member that holds more
  than one shard at a step boundary (the leader after reclaiming a departed member's) parks
  them all, and every member claims one parked shard per step before reading new ones.

So each shard is in exactly one committed step; it is in more than one step only when the
others were aborted. A step with no shard at all is idle: the loop checks whether the task
has finished (then every member leaves) and waits for work.
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass
from typing import Any

import redis

from queueworks import events
from queueworks import script_calls as calls
from queueworks.connection import text
from queueworks.messages import BadMessage, NotJSON, decode_entry, to_json
from queueworks.models import Role, TaskState
from queueworks.script_calls import Call, StepEnd
from queueworks.scripts import READ_EPOCH_MOVED, READ_FENCED, Queued, read_reply
from queueworks.signals import ColdStop
from queueworks.steps import Generation, StepAborted, StepContext, StepInfo, StepTrainer
from queueworks.wire import Line, pack_any

from .ledger import Ledger
from .loop import Run
from .work import Leave, Work

COMMIT, ABORT = "commit", "abort"
FORM_BACKOFF = 0.02  # seconds between attempts to form a group (unless the set changes)


class TrainerFailed(Exception):
    """A trainer method raised something other than ``StepAborted``."""


@dataclass(frozen=True)
class _Recorded:
    rank: int
    stream: str
    entry_id: str
    index: int


class _Live:
    """The run as a trainer sees it (``queueworks.steps.LiveRole``)."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def role(self) -> Role:
        role = self.run.membership.role
        assert role is not None
        return role

    def suspended(self) -> bool:
        """Only a real reason counts: the suspend event can be left set by a wake-up that
        raced with the re-rank that already took the new epoch into account."""
        s, role = self.run.state, self.run.membership.role
        if not s.suspend.is_set():
            return False
        return (
            s.stopping
            or s.fenced
            or s.assign != self.run.tk.task_id
            or role is None
            or s.epoch_seen > role.epoch
        )

    def wait(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        if self.run.state.suspend.wait(seconds) and not self.suspended():
            time.sleep(max(0.0, deadline - time.monotonic()))  # a stale wake-up
        return self.suspended()


def _call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except (StepAborted, Leave, ColdStop, redis.ConnectionError, redis.TimeoutError):
        raise
    except BaseException as exc:  # a trainer's SystemExit too: the trainer's, not ours
        raise TrainerFailed("".join(traceback.format_exception(exc))) from exc


def _records(raw: list[bytes | None]) -> list[_Recorded]:
    """The shards the ranks recorded for a step, by rank."""
    out = []
    for rank, value in enumerate(raw):
        if value is not None:
            stream, entry_id, index = json.loads(value)
            out.append(_Recorded(rank, str(stream), str(entry_id), int(index)))
    return out


def _fail_task(run: Run, exc: Exception) -> None:
    error = str(exc)[-8000:]
    run.log.error("step_trainer_failed", error=error)
    if run.scripts.set_state(run.tk, TaskState.FAILED.value, time.time(), error):
        events.emit(run.r, run.keys, "failed", task=run.tk.task_id, error=error[:200])


def _run_all(run: Run, line: Line | None, batch: list[Call[Any]]) -> list[Any]:
    """Script calls in one round trip, their replies read: packed once and sent on a
    connection kept for it (``queueworks.wire``: none of redis-py's per-call work), else
    (a cluster) on a pipeline. A connection that fails sends them again on the pipeline,
    which retries as redis-py does: every call in a step's end is safe to repeat (the first
    proposal stays, a settle counts an entry once, an entry read twice waits in our pending
    list to be reclaimed)."""
    if line is not None:
        packed = b"".join(
            pack_any("EVALSHA", run.scripts.sha(c.name), len(c.keys), *c.keys, *c.args)
            for c in batch
        )
        try:
            raw = line.call_all(packed, len(batch))
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # as redis-py: again
            run.log.warning("step_call_retried", error=str(exc))
        else:
            return [read_reply(run.scripts, c, x) for c, x in zip(batch, raw, strict=True)]
    pipe = run.r.pipeline(transaction=False)
    queued = [Queued(run.scripts, c, pipe) for c in batch]
    replies = pipe.execute(raise_on_error=False)
    return [q.reply(replies) for q in queued]


class StepLoop:
    """The lockstep loop of one member (``serve`` ends by raising ``Leave``)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.ledger = Ledger(run.r, run.scripts, run.tk, run.keys, run.spec, run.state, run.log)
        self.trainer: StepTrainer | None = None
        self.failed = False
        self.key = run.tk.steps
        self.gen: Generation | None = None
        self.next_round = (-1, 0)  # (epoch, round) to form next
        self.seq = 0
        self.backlog: list[_Recorded] = []  # peers' shards of our last committed step
        self.ahead: tuple[str, Work] | None = None  # taken and recorded for that step field
        self.line = Line.of(run.r)  # for the step's round trip (``_run_all``)

    def serve(self) -> None:
        run = self.run
        try:
            if run.spec.partitions:
                raise TrainerFailed("step mode does not take partitions")
            ctx = StepContext(run.tk.task_id, run.me, run.spec, run.r, run.tk, run.log, _Live(run))
            assert run.handler is not None
            self.trainer = _call(run.handler.fn, ctx)
            self._serve(self.trainer)
        except TrainerFailed as exc:
            self.failed = True
            _fail_task(run, exc)
            raise Leave("finished") from None

    def _serve(self, trainer: StepTrainer) -> None:
        r = self.run
        while True:
            if r.state.suspend.is_set():
                self._settle_backlog()  # before a re-rank may reclaim them
            r.check()
            if len(r.held) > 1:  # spread what we hold: park it, one claim per member and step
                self._charge_all()
                r.hand_back(r.streams)
            gen = self._form(trainer)
            if gen is not None:
                self._step(trainer, gen)

    def close(self, reason: str) -> None:
        try:
            self._close(reason)
        finally:
            if self.line is not None:  # the connection it kept goes back to the pool
                self.line.close()

    def _close(self, reason: str) -> None:
        if self.trainer is None:
            return
        if self.failed:
            reason = "failed"
        try:
            self._settle_backlog()
            if reason == "finished":  # what is left of the last steps expires with the task
                self.run.r.expire(self.key, int(self.run.spec.result_ttl))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.run.log.warning("settle_failed", error=str(exc))
        try:
            self.trainer.close(reason)
        except Exception as exc:
            self.run.log.warning("trainer_close_failed", error=repr(exc))

    # -- generations ----------------------------------------------------------------------

    def _form(self, trainer: StepTrainer) -> Generation | None:
        role = self.run.membership.role
        assert role is not None
        if self.gen is not None and self.gen.role == role:
            return self.gen
        epoch, rnd = self.next_round
        gen = Generation(role, rnd if epoch == role.epoch else 0)
        self.gen = None
        started = time.monotonic()
        try:
            _call(trainer.on_role, gen)
        except StepAborted as exc:
            self.run.log.info("group_not_formed", generation=gen.id, reason=str(exc))
            self.next_round = (role.epoch, gen.round + 1)
            self.run.state.suspend.wait(FORM_BACKOFF)
            return None
        self.gen, self.seq, self.next_round = gen, 0, (role.epoch, gen.round)
        self.run.log.info(
            "group_formed",
            generation=gen.id,
            rank=role.rank,
            world_size=role.world_size,
            ms=round((time.monotonic() - started) * 1000, 1),
        )
        return gen

    # -- one step -------------------------------------------------------------------------

    def _step(self, trainer: StepTrainer, gen: Generation) -> None:
        run = self.run
        name = f"{gen.id}.{self.seq}"
        mine = f"{name}.{gen.role.rank}"
        work, recorded = self._take(mine)
        index: int | None = None
        if work is not None:
            index = self._prepare(trainer, work)
            if index is None:
                if recorded:  # it failed: it is not in the step after all
                    run.r.hdel(self.key, mine)
                work = None
            elif not recorded:
                run.r.hset(self.key, mine, json.dumps([work.stream, work.entry_id, index]))
        if work is None:
            _call(trainer.prepare, None)
        ok, result = True, None
        try:
            result = _call(trainer.reduce)
        except StepAborted as exc:
            ok = False
            run.log.info("step_aborted", generation=gen.id, seq=self.seq, reason=str(exc))
            self._settle_backlog()
        end = self._end(gen, name, ok, work, index, result)
        shards = _records(end.recorded)
        committed = end.decision == COMMIT
        info = StepInfo(gen, self.seq, tuple(x.index for x in shards), index, committed)
        if committed and not end.fenced:
            _call(trainer.commit if ok else trainer.abort, info)
            self.backlog = [x for x in shards if x.rank != gen.role.rank]
        else:  # aborted, or we were pruned (a committed step settled our shard already)
            _call(trainer.abort, info)
            if work is not None and not committed:
                run.held.appendleft(work)  # same attempt: an aborted step spends none
            self.backlog = []
            if end.fenced:
                run.state.fenced = True  # pruned: the check parks what we hold and rejoins
        self.seq += 1
        if not ok or not committed or end.fenced:
            self.gen = None  # this group is broken: form the next round
            self.next_round = (gen.role.epoch, gen.round + 1)
        elif not shards:
            run.idle()  # nobody had a shard: finished (Leave), or wait for work

    def _take(self, field_name: str) -> tuple[Work | None, bool]:
        """At most one shard, and whether it is recorded in the step already: the one the
        last step took for this one, else one in hand, else a parked one, else a new one."""
        run = self.run
        ahead, self.ahead = self.ahead, None
        if ahead is not None and run.held and run.held[0] is ahead[1]:
            run.held.popleft()
            if ahead[0] == field_name:
                return ahead[1], True
            run.held.appendleft(ahead[1])  # taken for a step that did not come: in hand
        elif ahead is not None and ahead[0] == field_name:
            run.r.hdel(self.key, field_name)  # something else comes first: not its record
        while run.held:
            work = self.ledger.start(run.held.popleft())
            if work is not None:
                return work, False
        stream = run.streams[0]
        parked, gone = run.reclaim.parked_one(stream)
        self.ledger.bury_gone(stream, gone)
        if parked is not None:
            return parked, False
        role = run.membership.role
        assert role is not None
        status, reply = run.scripts.fenced_read(run.tk, run.owned, run.me, 1, role.epoch)
        if status == READ_FENCED:
            run.state.fenced = True
        elif status == READ_EPOCH_MOVED:
            run.state.observe_epoch(int(reply))  # this step still runs; re-rank after it
        elif status == 1:
            for name, entries in reply:
                for entry_id, flat in entries:
                    fields = {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}
                    return Work(text(name), text(entry_id), fields, 1), False
        return None, False

    def _charge_all(self) -> None:
        """Charge what we hold that may have run before (reclaimed from a departed member)
        before parking it: a parked entry is not charged again when claimed."""
        run = self.run
        held = [self.ledger.start(w) for w in run.held]
        run.held.clear()
        run.held.extend(w for w in held if w is not None)

    def _prepare(self, trainer: StepTrainer, work: Work) -> int | None:
        """Decode the shard and run ``prepare``; None if it failed (retry or dead letter)."""
        run = self.run
        try:
            sub = decode_entry(work.entry_id, work.fields)
        except BadMessage as exc:
            self.ledger.bury(work, None, "malformed entry", str(exc))
            return None
        try:  # the shard's local work is bounded by subtask_timeout, as a handler is
            run.watchdog.call(sub.index, trainer.prepare, sub.payload)
        except (StepAborted, Leave, ColdStop, redis.ConnectionError, redis.TimeoutError):
            raise
        except BaseException as exc:  # SystemExit in prepare too: a failed attempt
            retry = self.ledger.failed(work, sub.index, exc, sub.raw_payload)
            if retry is not None:
                run.held.appendleft(retry)
            return None
        return sub.index

    def _body(self, result: Any) -> str:
        try:
            return to_json(result, "result")
        except NotJSON as exc:
            self.run.log.warning("result_not_json", error=str(exc))
            return "null"

    def _end(
        self,
        gen: Generation,
        name: str,
        ok: bool,
        work: Work | None,
        index: int | None,
        result: Any,
    ) -> StepEnd:
        """End the step in one round trip (``step.lua``): propose commit/abort (the first
        proposal stored wins; a member pruned from the node set decides nothing), read the
        ranks' records, settle our shard if the step committed (the settle checks the
        decision in the same atomic step), and take and record our shard of the next step.
        The leader drops the previous step's fields: every member is past it."""
        run = self.run
        if self.ledger.pending():
            self.ledger.flush()  # dead letters of a failed prepare: whatever the step does
        leader = gen.role.leader
        drop = f"{gen.id}.{self.seq - 1}" if ok and leader and self.seq > 0 else ""
        take = ""
        if ok and not run.held and not run.state.suspend.is_set():
            take = f"{gen.id}.{self.seq + 1}.{gen.role.rank}"
        proposal = COMMIT if ok else ABORT
        batch: list[Call[Any]] = [
            calls.step(
                run.tk, run.me, name, proposal, gen.role.world_size,
                drop=drop, take=take, epoch=gen.role.epoch,
            )
        ]  # fmt: skip
        stream = ""
        if work is not None and index is not None:
            stream = work.stream
            own = [(work.entry_id, index, self._body(result if ok else None))]
            settle = calls.settle(run.tk, stream, run.me, time.time(), own, only_if=(name, COMMIT))
            batch.append(settle)
        replies = _run_all(run, self.line, batch)
        end: StepEnd = replies[0]
        if len(replies) > 1 and end.decision == COMMIT:
            run.state.processed += 1
            self.ledger.finish(self.ledger.note(stream, replies[1]))
        if end.moved_to:
            run.state.observe_epoch(end.moved_to)
        if end.entry is not None:
            entry_id, fields = end.entry
            taken = Work(run.tk.stream, entry_id, fields, 1)
            run.held.appendleft(taken)  # in hand: a re-rank meanwhile hands it back
            if end.held:
                self.ahead = (take, taken)
        if ok and leader and self.seq == 0 and end.decision == COMMIT and not end.fenced:
            self._drop_old_generations(gen)
        return end

    def _drop_old_generations(self, gen: Generation) -> None:
        """Every member of this generation is past the older ones, and members that left
        are fenced out of deciding: their fields can go."""
        mine = gen.id + "."
        old = [f for f in (text(k) for k in self.run.r.hkeys(self.key)) if not f.startswith(mine)]
        if old:
            self.run.r.hdel(self.key, *old)

    def _settle_backlog(self) -> None:
        """Ack the peers' shards of our last committed step (a no-op for those already acked:
        the settle script counts an entry only when XACK removed it)."""
        if not self.backlog:
            return
        for x in self.backlog:
            self.ledger.succeeded(x.stream).append((x.entry_id, x.index, "null"))
        self.backlog = []
        self.ledger.flush()
