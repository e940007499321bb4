"""Lockstep mode (``TaskSpec(mode="step")``): every member of the node set runs each step
together, for data-parallel training that keeps going while the node set changes.

This module knows streams and membership, not any framework: it never imports torch. The
trainer it drives follows the step contract in ``queueworks.task.steps`` (``StepTrainer``,
``StepContext``, ``Generation``, ``StepInfo``, ``StepAborted``).

**One step.** Each member takes at most one shard: one taken for this step by an earlier
step's end, else one it holds (an aborted step's, or reclaimed), else one parked, else a new
one (fenced by membership and epoch). It records the shard in the task's ``steps`` hash, runs
``prepare`` and ``reduce``, and proposes a decision: ``commit`` if its collective completed,
``abort`` if not. A commit overrides an abort; an abort is stored only when nothing is
(fenced by membership: a member pruned from the node set decides nothing):

* A completed all-reduce on any member proves every member entered it, so every shard of
  the step is recorded and every contribution arrived: committing is correct even if a peer
  died right after, or its own collective failed after ours completed. So a member whose
  collective completed knows the decision before Redis answers, unless it was pruned.
  A departure that breaks the collective aborts the step; a join does not (the joiner is
  not in the step), it only starts a new generation after it.
* Commit: each member settles its own shard (ack + result, counted once). The others'
  shards are kept and settled too if the next collective fails, before any re-rank, so a
  member that died between commit and ack never has its shard reclaimed and run again.
* Abort: the shard stays in hand (``run.held``): no attempt spent. A peer whose collective
  completed may still commit the step; it then settles our shard with its others, before
  its next group forms, so a shard held from an aborted step is run again only if it is
  still pending once our next group has formed. A member that holds more than one shard at
  a step boundary (the leader after reclaiming a departed member's) parks them all, and
  every member claims one parked shard per step before reading new ones.

**Ending without waiting.** With a trainer that has ``apply`` (the torch one), a member whose
collective completed sends its step's end (``step.lua`` and the settle of its shard, one
write) and applies the update at once, without waiting for the reply; it reads the reply
while the next step's all-reduce runs (``StepContext.meanwhile``, which the trainer calls
once its all-reduce has started), and only then calls ``commit`` (checkpoint, records).
The step's end also takes the member's shard of the step after next, so that the next
``prepare`` never waits for Redis: between changes no round trip, and little of the Python
around it, is on the step's critical path. A member pruned meanwhile (its end was fenced)
has applied an update the node set may not have committed: its trainer hears ``abort``
and takes its state from a peer at the next group, and the step it was in the middle of
is aborted (its group dropped). Every member sent its step's end a whole ``prepare``
before the leader can drop that step's fields (at its end of the next step), and reads it
before forming a group; an end whose send failed is sent again before the next
collective.

So each shard is in exactly one committed step; it is in more than one step only when the
others were aborted. A step with no shard at all is idle: the loop checks whether the task
has finished (then every member leaves) and waits for work.
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any

import redis

from queueworks.errors import NotJSON, StepAborted
from queueworks.process import ColdStop
from queueworks.protocol import events
from queueworks.protocol.messages import BadMessage, decode_subtask, text, to_json
from queueworks.protocol.models import Role, TaskState
from queueworks.scripts import calls
from queueworks.scripts.bound import READ_EPOCH_MOVED, READ_FENCED, Queued, read_replies
from queueworks.scripts.calls import Call, StepEnd
from queueworks.task.steps import Generation, StepContext, StepInfo, StepTrainer
from queueworks.transport.wire import Line, Sent, pack_any

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
    """The run as a trainer sees it (``queueworks.task.steps.LiveRole``)."""

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
    """Script calls in one round trip, their replies read (``_send_all``, ``_replies``)."""
    return _replies(run, batch, _send_all(run, line, batch))


def _send_all(run: Run, line: Line | None, batch: list[Call[Any]]) -> Sent | None:
    """Send script calls in one write, packed once, on a connection kept for it
    (``queueworks.transport.wire``: none of redis-py's per-call work); None when there is no line (a
    cluster) or the send failed: ``_replies`` then sends them again on a pipeline."""
    if line is None:
        return None
    packed = b"".join(
        pack_any("EVALSHA", run.scripts.sha(c.name), len(c.keys), *c.keys, *c.args) for c in batch
    )
    try:
        return line.send_all(packed, len(batch))
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # as redis-py: again
        run.log.warning("step_call_retried", error=str(exc))
        return None


def _replies(run: Run, batch: list[Call[Any]], sent: Sent | None) -> list[Any]:
    """The replies of ``batch`` sent as ``sent``. A connection that failed sends them again
    on a pipeline, which retries as redis-py does; a NOSCRIPT reply runs that call and
    those after it again, in order (``read_replies``): every call in a step's end is safe
    to repeat (a proposal stored stays, a settle counts an entry once, an entry read twice
    waits in our pending list to be reclaimed)."""
    if sent is not None:
        try:
            raw = sent.replies()
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # as redis-py: again
            run.log.warning("step_call_retried", error=str(exc))
        else:
            return read_replies(run.scripts, batch, raw)
    pipe = run.r.pipeline(transaction=False)
    queued = [Queued(run.scripts, c, pipe) for c in batch]
    replies = pipe.execute(raise_on_error=False)
    at = [q.index for q in queued if q.index is not None]
    if len(at) < len(queued):  # a cluster: each call ran at once, in order
        return [q.reply(replies) for q in queued]
    return read_replies(run.scripts, batch, [replies[i] for i in at])


@dataclass(frozen=True)
class _Ahead:
    """A shard taken and recorded for a step still to come (``field`` of step ``seq`` of
    generation ``gen``)."""

    gen: str
    seq: int
    field: str
    work: Work


@dataclass
class _Ending:
    """A step's end sent (``step.lua``, and the settle of our shard: ``batch``), its
    replies not read yet; followed by ``StepLoop._finish``."""

    gen: Generation
    seq: int
    name: str
    ok: bool  # our collective completed: we proposed commit
    work: Work | None
    index: int | None
    take: list[int]  # the steps ahead it takes a shard for
    batch: list[Call[Any]]
    sent: Sent | None


class Ends:
    """How a member ends its steps: the calls of a step's end (``step.lua``, and the settle
    of its shard) sent at once, in one write, and their replies read when the loop needs
    them (``replies``): at once, or, for a step whose update was applied without waiting,
    while the next step's all-reduce runs."""

    def __init__(self, run: Run, hand: Hand, ledger: Ledger) -> None:
        self.run, self.hand, self.ledger = run, hand, ledger
        self.line = Line.of(run.r)  # for the step's round trip (``_send_all``)

    @property
    def lazy(self) -> bool:
        """Whether a step's reply can wait: its calls went out on a line of their own."""
        return self.line is not None

    def replies(self, ending: _Ending) -> list[Any]:
        return _replies(self.run, ending.batch, ending.sent)

    def close(self) -> None:
        if self.line is not None:  # the connection it kept goes back to the pool
            self.line.close()

    def open(
        self,
        gen: Generation,
        seq: int,
        name: str,
        ok: bool,
        work: Work | None,
        index: int | None,
        result: Any,
        depth: int,
    ) -> _Ending:
        """The step's end, one round trip (``step.lua``): propose commit/abort (a
        commit overrides an abort; a member pruned from the node set decides nothing), read
        the ranks' records, settle our shard if the step committed (the settle checks the
        decision in the same atomic step), and take and record our shards of the next
        ``depth`` steps (those not taken yet). The leader drops the previous step's fields:
        every member read its end before this step's collective."""
        if self.ledger.pending():
            self.ledger.flush()  # dead letters of a failed prepare: whatever the step does
        leader, rank = gen.role.leader, gen.role.rank
        drop = f"{gen.id}.{seq - 1}" if ok and leader and seq > 0 else ""
        take = self.hand.wanted(gen, seq, depth) if ok else []
        fields = [f"{gen.id}.{k}.{rank}" for k in take]
        batch = self._batch(gen, name, ok, drop, fields, work, index, result)
        return _Ending(
            gen, seq, name, ok, work, index, take, batch, _send_all(self.run, self.line, batch)
        )

    def _batch(
        self,
        gen: Generation,
        name: str,
        ok: bool,
        drop: str,
        take: list[str],
        work: Work | None,
        index: int | None,
        result: Any,
    ) -> list[Call[Any]]:
        """The calls of a step's end (``open``)."""
        run = self.run
        proposal = COMMIT if ok else ABORT
        batch: list[Call[Any]] = [
            calls.step(
                run.tk, run.me, name, proposal, gen.role.world_size, drop=drop, take=take,
                epoch=gen.role.epoch,
            )
        ]  # fmt: skip
        if work is not None and index is not None:
            own = [(work.entry_id, index, self._body(result if ok else None))]
            if_commit = (name, COMMIT)
            settle = calls.settle(run.tk, work.stream, run.me, time.time(), own, only_if=if_commit)
            batch.append(settle)
        return batch

    def _body(self, result: Any) -> str:
        try:
            return to_json(result, "result")
        except NotJSON as exc:
            self.run.log.warning("result_not_json", error=str(exc))
            return "null"


def _in_hand(held: Any, work: Work) -> bool:
    return any(w is work for w in held)


class Hand:
    """The shards a member holds for its steps: taken ahead for the steps to come (by an
    earlier step's end, recorded there), in hand (``run.held``), parked, or new."""

    def __init__(self, run: Run, ledger: Ledger) -> None:
        self.run, self.ledger, self.key = run, ledger, run.tk.steps
        self.ahead: list[_Ahead] = []  # taken and recorded for steps to come, in step order

    def take(self, gen: Generation, seq: int) -> tuple[Work | None, bool]:
        """At most one shard for step ``seq``, and whether it is recorded in the step
        already: the one an earlier step took for it, else one in hand, else a parked one,
        else a new one."""
        run = self.run
        ahead, self.ahead = self.ahead, []
        found: Work | None = None
        for a in ahead:
            coming = a.gen == gen.id and a.seq >= seq
            if not _in_hand(run.held, a.work):
                if coming:  # handed back: that step comes without it
                    run.r.hdel(self.key, a.field)
            elif coming and a.seq == seq:
                found = a.work
            elif coming:
                self.ahead.append(a)
            # else taken for a step that did not come: in hand, as any other
        if found is not None:
            run.held.remove(found)
            return found, True
        while run.held:
            held = run.held.popleft()
            if held.recheck and not self._still_pending(held):
                continue  # settled by the step it was in after all
            work = self.ledger.start(held)
            if work is not None:
                return work, False
        return self._new(), False

    def _new(self) -> Work | None:
        """A parked shard, else a new one (fenced by membership and epoch)."""
        run = self.run
        stream = run.streams[0]
        parked, gone = run.reclaim.parked_one(stream)
        self.ledger.bury_gone(stream, gone)
        if parked is not None:
            return parked
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
                    return Work(text(name), text(entry_id), fields, 1)
        return None

    def _still_pending(self, work: Work) -> bool:
        """Whether ``work`` is still pending with us (JUSTID: no attempt spent)."""
        r, group, me = self.run.r, self.run.tk.group, self.run.me
        return bool(r.xclaim(work.stream, group, me, 0, [work.entry_id], justid=True))

    def wanted(self, gen: Generation, seq: int, depth: int) -> list[int]:
        """The steps after ``seq`` (up to ``depth`` ahead) to take a shard for now: none
        while we hold anything else, or the run is about to change."""
        if self.extra() or self.run.state.suspend.is_set():
            return []
        have = {a.seq for a in self.ahead if a.gen == gen.id}
        return [k for k in range(seq + 1, seq + 1 + depth) if k not in have]

    def taken(self, gen: Generation, steps: list[int], entries: Any) -> None:
        """Hold what a step's end took for ``steps`` (in order; fewer if the stream had
        fewer): in hand, so that a re-rank meanwhile hands it back."""
        for k, (entry_id, fields, recorded) in zip(steps, entries, strict=False):
            work = Work(self.run.tk.stream, entry_id, fields, 1)
            self.run.held.append(work)
            if recorded:  # (else its index does not decode: it is dead-lettered when run)
                self.ahead.append(_Ahead(gen.id, k, f"{gen.id}.{k}.{gen.role.rank}", work))

    def extra(self) -> int:
        """How many entries we hold besides those taken for the steps to come."""
        return sum(1 for w in self.run.held if not any(a.work is w for a in self.ahead))

    def spread(self) -> None:
        """Park all we hold, one claim per member and step. What may have run before
        (reclaimed from a departed member) is charged first: a parked entry is not charged
        again when claimed."""
        run = self.run
        held = [self.ledger.start(w) for w in run.held]
        run.held.clear()
        run.held.extend(w for w in held if w is not None)
        run.hand_back(run.streams)


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
        self.hand = Hand(run, self.ledger)
        self.ending: _Ending | None = None  # a step's end sent, its reply not read yet
        self.ends = Ends(run, self.hand, self.ledger)

    def serve(self) -> None:
        run = self.run
        try:
            if run.spec.partitions:
                raise TrainerFailed("step mode does not take partitions")
            ctx = StepContext(run.tk.task_id, run.me, run.spec, run.r, run.tk, run.log, _Live(run))
            ctx.meanwhile = self._meanwhile
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
            if self.ending is not None and self._disturbed():
                self._finish(trainer)  # its shards, before a re-rank may hand them back
            if r.state.suspend.is_set():
                self._settle_backlog()  # before a re-rank may reclaim them
            r.check()
            if self.hand.extra() > 1:  # spread what we hold
                self.hand.spread()
            gen = self._form(trainer)
            if gen is not None:
                self._step(trainer, gen)

    def _disturbed(self) -> bool:
        """The run's safe point has something to do (``Run.check``)."""
        s = self.run.state
        return (
            s.suspend.is_set()
            or s.stopping
            or s.fenced
            or s.assign != self.run.tk.task_id
            or self.ledger.ended
        )

    def close(self, reason: str) -> None:
        try:
            self._close(reason)
        finally:
            self.ends.close()

    def _close(self, reason: str) -> None:
        if self.trainer is None:
            return
        if self.failed:
            reason = "failed"
        try:
            if self.ending is not None:
                self._finish(self.trainer)
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
        if self.ending is not None:  # every member reads its last step's end before forming
            self._finish(trainer)
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
        """One step: take a shard, ``prepare``, read the last step's end (sent while this
        step's shard was prepared), ``reduce``, and end the step. With a trainer that
        applies an update early (``apply``), a step whose collective completed ends without
        waiting: its update is applied at once (a completed collective commits the step:
        ``step.lua``) and its reply is read while the next all-reduce runs; the shards
        are taken two steps ahead, so that ``prepare`` never waits for that reply."""
        run = self.run
        name = f"{gen.id}.{self.seq}"
        work, recorded = self.hand.take(gen, self.seq)
        index: int | None = None
        if work is not None:
            index = self._prepare(trainer, work)
            if index is None:
                if recorded:  # it failed: it is not in the step after all
                    run.r.hdel(self.key, f"{name}.{gen.role.rank}")
                work = None
            elif not recorded:
                value = json.dumps([work.stream, work.entry_id, index])
                run.r.hset(self.key, f"{name}.{gen.role.rank}", value)
        if work is None:
            _call(trainer.prepare, None)
        if self.ending is not None and self.ending.sent is None and not self._finish(trainer):
            return self._abandon(trainer, gen, work, index)  # (its send failed: read first)
        ok, result = True, None
        try:
            result = _call(trainer.reduce)  # (``_meanwhile``: the last step's end read)
        except StepAborted as exc:
            ok = False
            run.log.info("step_aborted", generation=gen.id, seq=self.seq, reason=str(exc))
            self._settle_backlog()
        if self.ending is not None and not self._finish(trainer):  # not read meanwhile
            return self._abandon(trainer, gen, work, index)
        apply = getattr(trainer, "apply", None) if ok else None
        lazy = apply is not None and work is not None and self.ends.lazy
        ending = self.ends.open(gen, self.seq, name, ok, work, index, result, 2 if lazy else 1)
        self.seq += 1
        self.ending = ending
        if lazy and apply is not None and self.seq not in ending.take:
            _call(apply)  # the reply is read while the next collective runs
        else:
            self._finish(trainer)

    def _meanwhile(self) -> None:
        """While the step's collective is in flight: read the last step's end (sent a step
        ago). ``StepAborted`` if it broke the group (we were pruned)."""
        trainer = self.trainer
        if self.ending is not None and trainer is not None and not self._finish(trainer):
            raise StepAborted("pruned from the node set in the last step")

    def _abandon(
        self, trainer: StepTrainer, gen: Generation, work: Work | None, index: int | None
    ) -> None:
        """The last step's end broke the group (we were pruned): this step is not ours to
        end. Our shard is held again, no attempt spent; peers that completed the step anyway
        settle it, so it runs again only if still pending later (``recheck``)."""
        if work is not None:
            self.run.held.appendleft(replace(work, recheck=True))
        _call(trainer.abort, StepInfo(gen, self.seq, (), index, False))

    def _prepare(self, trainer: StepTrainer, work: Work) -> int | None:
        """Decode the shard and run ``prepare``; None if it failed (retry or dead letter)."""
        run = self.run
        try:
            sub = decode_subtask(work.entry_id, work.fields)
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

    def _finish(self, trainer: StepTrainer) -> bool:
        """Read the end of the step in flight and follow its decision: ``commit`` or
        ``abort``, the peers' shards kept to settle, ours held again if it did not commit.
        False if the group is broken (then the next round is formed)."""
        ending, self.ending = self.ending, None
        assert ending is not None
        run, gen = self.run, ending.gen
        replies = self.ends.replies(ending)
        end: StepEnd = replies[0]
        if len(replies) > 1 and end.decision == COMMIT:
            assert ending.work is not None
            run.state.processed += 1
            self.ledger.finish(self.ledger.note(ending.work.stream, replies[1]))
        if end.moved_to:
            run.state.observe_epoch(end.moved_to)
        self.hand.taken(gen, ending.take, end.entries)
        committed = end.decision == COMMIT
        leader = gen.role.leader
        if ending.ok and leader and ending.seq == 0 and committed and not end.fenced:
            self._drop_old_generations(gen)
        shards = _records(end.recorded)
        info = StepInfo(gen, ending.seq, tuple(x.index for x in shards), ending.index, committed)
        if committed and not end.fenced:
            _call(trainer.commit if ending.ok else trainer.abort, info)
            self.backlog = [x for x in shards if x.rank != gen.role.rank]
        else:  # aborted, or we were pruned (a committed step settled our shard already)
            _call(trainer.abort, info)
            if ending.work is not None and not committed:  # same attempt: none spent (a
                # peer whose collective completed may still commit it: ``recheck``)
                run.held.appendleft(replace(ending.work, recheck=True))
            self.backlog = []
            if end.fenced:
                run.state.fenced = True  # pruned: the check parks what we hold and rejoins
        if not ending.ok or not committed or end.fenced:
            if self.gen == gen:
                self.gen = None  # this group is broken: form the next round
            self.next_round = (gen.role.epoch, gen.round + 1)
            return False
        if not shards:
            run.idle()  # nobody had a shard: finished (Leave), or wait for work
        return True

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
