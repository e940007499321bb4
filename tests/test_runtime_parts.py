"""The runtime's parts in-process against a real Redis server, no worker processes:
``Membership`` (join, roles, fence, leave), ``Ledger`` (settle, attempts, dead letters,
rejects) and ``Reclaim`` (departed, adopt-own, backstop, hand-back), and a zombie's late
ack through the ledger."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
import structlog

from queueworks import Client, TaskSpec, TaskState
from queueworks.protocol.keys import PARKED
from queueworks.protocol.models import StoredSpec
from queueworks.scripts.bound import DeadEntry, Scripts
from queueworks.workers.heartbeat import NodeState
from queueworks.workers.ledger import Ledger
from queueworks.workers.member import Membership
from queueworks.workers.reclaim import Reclaim
from queueworks.workers.work import Work

pytestmark = pytest.mark.integration

LOG = structlog.get_logger("test")


class Member:
    """One in-process member of a task: its state and its three parts."""

    def __init__(self, client: Client, task_id: str, name: str, *, ttl: float = 3.0) -> None:
        r, keys = client.redis, client.keys
        self.r, self.tk = r, keys.task(task_id)
        self.scripts = Scripts(r)
        self.node = NodeState(name, started_at=time.time())
        self.node.assign = task_id
        self.state = self.node.seat(task_id)
        raw: Any = r.hget(self.tk.record, "spec")
        self.spec = StoredSpec.model_validate_json(raw)
        self.membership = Membership(r, self.scripts, self.tk, keys, self.state, ttl=ttl, log=LOG)
        self.ledger = Ledger(r, self.scripts, self.tk, keys, self.spec, self.state, LOG)
        self.reclaim = Reclaim(r, self.scripts, self.tk, name)
        self.name = name

    def read(self, count: int) -> list[Work]:
        reply: Any = self.r.xreadgroup(self.tk.group, self.name, {self.tk.stream: ">"}, count=count)
        return [Work(self.tk.stream, e.decode(), f, 1) for e, f in (reply[0][1] if reply else [])]

    def settle(self, works: list[Work], result: str = '"ok"') -> None:
        ok = self.ledger.succeeded(self.tk.stream)
        ok += [(w.entry_id, w.index or 0, result) for w in works]
        self.ledger.flush()


def _task(client: Client, n: int, **spec: Any) -> str:
    return client.submit(
        TaskSpec(name="parts", handler="m:f", subtasks=[{"x": i} for i in range(n)], **spec)
    ).id


def _deliveries(r: redis.Redis, stream: str, group: str, entry_id: str) -> int:
    rows: Any = r.xpending_range(stream, group, entry_id, entry_id, 1)
    return int(rows[0]["times_delivered"]) if rows else 0


# -- Membership -------------------------------------------------------------------------------


def test_membership_join_roles_fence_and_leave(client: Client, r: redis.Redis) -> None:
    tid = _task(client, 3)
    a, b = Member(client, tid, "a"), Member(client, tid, "b")
    assert a.membership.join() and b.membership.join()
    ra, rb = a.membership.take_role(), b.membership.take_role()
    assert ra is not None and rb is not None and ra.members == rb.members == ("a", "b")
    assert a.membership.role is not None and b.membership.role is not None
    assert (a.membership.role.rank, b.membership.role.rank) == (0, 1)
    assert a.membership.role.world_size == 2 and a.membership.role.leader
    # a read's check: same epoch changes nothing; a new epoch suspends; a prune fences
    epoch = int(r.get(a.tk.epoch) or 0)
    assert not a.membership.fence(1.0, epoch) and not a.state.suspend.is_set()
    a.state.task_id = tid
    assert a.membership.fence(1.0, epoch + 1) and a.state.suspend.is_set()
    assert a.membership.fence(None, epoch) and a.state.fenced
    # b leaves: one epoch bump, a is alone and leader
    assert b.membership.leave() == epoch + 1
    ra = a.membership.take_role()
    assert ra is not None and ra.members == ("a",) and a.membership.role.world_size == 1
    # a pruned while away (its heartbeat gone): it has no role any more
    r.delete(a.tk.heartbeat("a"))
    assert a.scripts.depart(a.tk, "a", time.time(), "dead", only_if_dead=True)
    a.state.fenced = False
    assert a.membership.take_role() is None and a.state.fenced
    # joining a finished task is refused
    client.task(tid).cancel()
    assert not Member(client, tid, "c").membership.join()


def test_a_join_returns_its_roster_and_reads_only_as_a_member(
    client: Client, r: redis.Redis
) -> None:
    """``join.lua``'s reply is the roster at its epoch (the role needs no read), and the
    entries it was asked to read, read after the join as the new member; a task that cannot
    be joined is not read either."""
    tid = _task(client, 3)
    a, b = Member(client, tid, "a"), Member(client, tid, "b")
    joined = a.membership.join(read=(a.tk.stream, 2))
    assert joined is not None and joined.roster.members == ("a",)
    assert joined.roster.epoch == int(r.get(a.tk.epoch) or 0) == 1
    assert [b"i" in f and b"p" in f for _, f in joined.entries] == [True, True]
    ids = [e.decode() for e, _ in joined.entries]
    assert all(_deliveries(r, a.tk.stream, a.tk.group, i) == 1 for i in ids)
    assert a.reclaim.consumers(a.tk.stream) == {"a": 2}
    other = b.membership.join()  # no read asked: nothing read
    assert other is not None and other.entries == [] and other.roster.members == ("a", "b")
    # the join's roster gives the role, without a read; once a newer epoch is seen (b's
    # join), it is stale and the next take reads the roster again
    roster = a.membership.take_role(joined.roster)
    assert roster is joined.roster and a.membership.current(roster)
    a.state.observe_epoch(2)
    assert not a.membership.current(roster)
    again = a.membership.take_role()
    assert again is not None and again.members == ("a", "b")
    assert a.membership.role is not None and a.membership.role.epoch == 2
    assert b.membership.take_role(other.roster) is other.roster
    assert b.membership.role is not None and b.membership.role.rank == 1
    client.task(tid).cancel()
    c = Member(client, tid, "c")
    assert c.membership.join(read=(c.tk.stream, 5)) is None
    assert "c" not in a.reclaim.consumers(a.tk.stream)  # it read nothing
    assert r.zscore(a.tk.members, "c") is None


def test_a_settle_says_the_state_it_finished_the_task_in(client: Client, r: redis.Redis) -> None:
    done_id, failed_id = _task(client, 2), _task(client, 2, max_dead=0)
    for tid, state in ((done_id, "completed"), (failed_id, "failed")):
        a = Member(client, tid, "a")
        works = a.read(2)
        ok = [(works[0].entry_id, 0, "1")]
        first = a.scripts.settle(a.tk, a.tk.stream, "a", time.time(), ok)
        assert (first.finished, first.state) == (False, "")
        if state == "completed":
            last = a.scripts.settle(
                a.tk, a.tk.stream, "a", time.time(), [(works[1].entry_id, 1, "2")]
            )
        else:
            dead = DeadEntry(works[1].entry_id, 1, "failed", "boom", 1, "{}")
            last = a.scripts.settle(a.tk, a.tk.stream, "a", time.time(), [], [dead])
        assert (last.finished, last.active, last.state) == (True, False, state)
        assert r.hget(a.tk.record, "state") == state.encode()
        late = a.scripts.settle(a.tk, a.tk.stream, "a", time.time(), ok)  # finished: acks only
        assert (late.finished, late.state) == (False, "")


def test_membership_barrier_waits_for_every_member(client: Client) -> None:
    tid = _task(client, 1)
    a, b = Member(client, tid, "a"), Member(client, tid, "b")
    a.membership.join()
    b.membership.join()
    roster = a.membership.take_role()
    assert roster is not None
    a.state.epoch_seen = roster.epoch
    a.state.wake.set()
    b.state.task_id = tid
    # b never confirms and a newer epoch comes: a's barrier gives up (start over)
    a.state.epoch_seen = roster.epoch + 1
    assert not a.membership.barrier(roster)
    a.state.epoch_seen = roster.epoch
    client.redis.hset(a.tk.confirm, "b", roster.epoch)
    assert a.membership.barrier(roster)


# -- Ledger ---------------------------------------------------------------------------------


def test_ledger_settles_by_index_retries_and_dead_letters(client: Client, r: redis.Redis) -> None:
    tid = _task(client, 4, max_attempts=2)
    a = Member(client, tid, "a")
    works = a.read(10)
    assert [w.index for w in works] == [0, 1, 2, 3]
    a.settle(works[:2])
    status = client.task(tid).status()
    assert (status.done, status.dead) == (2, 0)
    # a failure spends an attempt, in Redis too, and returns the retry
    retry = a.ledger.failed(works[2], 2, RuntimeError("boom"), "{}")
    assert retry is not None and retry.attempt == 2
    assert _deliveries(r, a.tk.stream, a.tk.group, works[2].entry_id) == 2
    # the last attempt fails: dead-lettered with its traceback at the next flush
    assert a.ledger.failed(retry, 2, KeyboardInterrupt(), "{}") is None
    a.ledger.flush()
    (letter,) = client.task(tid).dead_letters()
    assert (letter.index, letter.reason, letter.attempts) == (2, "failed 2 times", 2)
    assert "KeyboardInterrupt" in letter.error
    # a stray entry buried as malformed is rejected, never counted
    stray = r.xadd(a.tk.stream, {"junk": "1"}).decode()
    (junk,) = [w for w in a.read(10) if w.entry_id == stray]
    a.ledger.bury(junk, None, "malformed entry", "entry must have fields 'i' and 'p'")
    a.settle([works[3]])
    status = client.task(tid).status()
    assert (status.state, status.done, status.dead, status.rejected) == (
        TaskState.COMPLETED,
        3,
        1,
        1,
    )
    assert a.ledger.ended  # the settle saw the task finish


def test_ledger_start_charges_what_may_have_run(client: Client, r: redis.Redis) -> None:
    tid = _task(client, 2, max_attempts=2)
    a = Member(client, tid, "a")
    first, second = a.read(2)
    # held but never run: nothing to charge
    assert a.ledger.start(first) is first
    # reclaimed (may have run): charged when it starts
    charged = a.ledger.start(Work(second.stream, second.entry_id, second.fields, 1, True))
    assert charged is not None and charged.attempt == 2
    assert _deliveries(r, a.tk.stream, a.tk.group, second.entry_id) == 2
    # charged past max_attempts: dead-lettered instead of started
    again = Work(second.stream, second.entry_id, second.fields, 2, True)
    assert a.ledger.start(again) is None
    a.ledger.flush()
    (letter,) = client.task(tid).dead_letters()
    assert letter.reason == "exceeded max_attempts" and letter.attempts == 2


# -- Reclaim --------------------------------------------------------------------------------


def test_reclaim_departed_takes_everything_charged_and_parked_uncharged(
    client: Client, r: redis.Redis
) -> None:
    tid = _task(client, 6)
    a, b = Member(client, tid, "a"), Member(client, tid, "b")
    a.membership.join()
    b.membership.join()
    held = a.read(4)
    # a hands back its last two (they never ran) and then dies with the first two
    for w in held[2:]:
        r.xclaim(a.tk.stream, a.tk.group, PARKED, 0, [w.entry_id], justid=True)
    r.delete(a.tk.heartbeat("a"))
    assert b.scripts.depart(b.tk, "a", time.time(), "dead", only_if_dead=True)
    consumers = b.reclaim.consumers(b.tk.stream)
    assert consumers == {"a": 2, PARKED: 2}
    works, gone = b.reclaim.departed(b.tk.stream, consumers, members=("b",))
    assert not gone
    by_id = {w.entry_id: w for w in works}
    assert set(by_id) == {w.entry_id for w in held}
    assert [by_id[w.entry_id].charge for w in held] == [True, True, False, False]
    # a live member's entries are never taken
    a2 = Member(client, tid, "c")
    a2.membership.join()
    a2.read(1)
    consumers = b.reclaim.consumers(b.tk.stream)
    works, _ = b.reclaim.departed(b.tk.stream, consumers, members=("b",))  # narrowed wrongly
    assert works == []  # the script checks membership itself


def test_reclaim_adopt_own_and_backstop(client: Client, r: redis.Redis) -> None:
    tid = _task(client, 4)
    a = Member(client, tid, "a")
    a.membership.join()
    held = a.read(2)
    # the same worker, restarted: takes its own pending entries back, charged
    again = Member(client, tid, "a")
    adopted = again.reclaim.adopt_own(again.tk.stream)
    assert [w.entry_id for w in adopted] == [w.entry_id for w in held]
    assert all(w.charge and w.attempt == 1 for w in adopted)
    # a wedged member (still a member) holding entries idle past the limit: the backstop
    b = Member(client, tid, "b")
    b.membership.join()
    works, gone = b.reclaim.backstop(b.tk.stream, idle_ms=60_000)
    assert works == [] and gone == []
    time.sleep(0.15)
    works, gone = b.reclaim.backstop(b.tk.stream, idle_ms=100)
    assert {w.entry_id for w in works} == {w.entry_id for w in held} and not gone
    assert all(w.charge for w in works)


def test_hand_back_keeps_the_interrupted_entry_and_reports_gone(
    client: Client, r: redis.Redis
) -> None:
    tid = _task(client, 3)
    a = Member(client, tid, "a")
    held = a.read(3)
    r.xdel(a.tk.stream, held[2].entry_id)  # its payload deleted while pending
    gone = a.reclaim.hand_back(a.tk.stream, keep={held[0].entry_id})
    assert gone == [(held[2].entry_id, 1)]
    consumers = a.reclaim.consumers(a.tk.stream)
    assert consumers == {"a": 2, PARKED: 1}  # the kept one and the gone one stay with a
    parked, lost = a.reclaim.parked_one(a.tk.stream)
    assert parked is not None and parked.entry_id == held[1].entry_id and not parked.charge
    assert lost == []


def test_a_zombies_late_ack_counts_nothing(client: Client, r: redis.Redis) -> None:
    tid = _task(client, 1)
    a, b = Member(client, tid, "a"), Member(client, tid, "b")
    a.membership.join()
    b.membership.join()
    (work,) = a.read(1)
    # a pauses past its TTL: pruned, b reclaims and settles the subtask
    r.delete(a.tk.heartbeat("a"))
    b.scripts.depart(b.tk, "a", time.time(), "dead", only_if_dead=True)
    works, _ = b.reclaim.departed(b.tk.stream, b.reclaim.consumers(b.tk.stream), ("b",))
    (taken,) = works
    started = b.ledger.start(taken)
    assert started is not None and started.attempt == 2
    b.settle([started], '"from-b"')
    # a wakes up and settles the same entry: nothing counted, nothing overwritten
    a.settle([work], '"from-a"')
    status = client.task(tid).status()
    assert (status.state, status.done, status.dead, status.rejected) == (
        TaskState.COMPLETED,
        1,
        0,
        0,
    )
    assert dict(client.task(tid).results()) == {0: "from-b"}


# -- a lockstep step's end (step.lua) ---------------------------------------------------------


def test_a_step_commit_overrides_an_abort_and_takes_the_steps_ahead(
    client: Client, r: redis.Redis
) -> None:
    """A member whose collective completed proves the step complete: its commit replaces an
    abort stored first (a peer whose collective failed after ours completed), and the settle
    of a shard guarded by the decision then counts. The end takes a shard for each step
    ahead asked for, recorded under that step's field, in order; an abort takes nothing,
    and a member pruned from the node set decides nothing."""
    from queueworks.scripts import calls

    tid = _task(client, 5, mode="step")
    a, b = Member(client, tid, "a"), Member(client, tid, "b")
    assert a.membership.join() and b.membership.join()
    a.membership.take_role()
    b.membership.take_role()
    assert a.membership.role is not None
    epoch, tk = a.membership.role.epoch, a.tk
    (wa,), (wb,) = a.read(1), b.read(1)
    for rank, w in enumerate((wa, wb)):
        r.hset(tk.steps, f"{epoch}.0.0.{rank}", f'["{w.stream}", "{w.entry_id}", {w.index}]')

    def end(m: Member, proposal: str, take: list[str]) -> calls.StepEnd:
        return m.scripts.run(
            calls.step(tk, m.name, f"{epoch}.0.0", proposal, 2, take=take, epoch=epoch)
        )

    def settle(m: Member, w: Work) -> Any:
        own = [(w.entry_id, w.index or 0, "null")]
        return m.scripts.run(
            calls.settle(tk, w.stream, m.name, time.time(), own, only_if=(f"{epoch}.0.0", "commit"))
        )

    first = end(b, "abort", [f"{epoch}.0.1.1"])
    assert first.decision == "abort" and first.entries == ()  # an abort takes nothing
    assert settle(b, wb) is not None and r.xpending(tk.stream, tk.group)["pending"] == 2
    ahead = [f"{epoch}.0.1.0", f"{epoch}.0.2.0"]
    won = end(a, "commit", ahead)
    assert won.decision == "commit" and not won.fenced
    assert [x is not None for x in won.recorded] == [True, True]
    assert len(won.entries) == 2 and all(recorded for _, _, recorded in won.entries)
    for field, (entry_id, _, _) in zip(ahead, won.entries, strict=True):
        assert f'"{entry_id}"' in str(r.hget(tk.steps, field))
    assert end(b, "abort", []).decision == "commit"  # an abort no longer replaces it
    settle(a, wa)
    settle(b, wb)  # the peer's shard of the committed step: counted now
    assert int(r.hget(tk.record, "done") or 0) == 2
    a.membership.leave()
    assert end(a, "commit", []).fenced  # no member: decides nothing


def test_a_step_end_sent_before_redis_has_step_lua_still_settles_its_shard(
    client: Client, r: redis.Redis
) -> None:
    """A step's end sends ``step.lua`` and the settle of our shard, guarded by the step's
    decision, in one write. If Redis has the settle's script but not ``step.lua``'s (the
    first step's end on this server, or a restart in between), the settle runs first and
    finds no decision: reading the replies must run both again, in order, or the shard of
    a committed step stays pending, to be reclaimed and trained again."""
    from redis.exceptions import NoScriptError

    from queueworks.scripts import calls
    from queueworks.scripts.bound import read_replies
    from queueworks.transport.wire import Line, pack_any

    tid = _task(client, 2, mode="step")
    a = Member(client, tid, "a")
    assert a.membership.join()
    a.membership.take_role()
    assert a.membership.role is not None
    epoch, tk = a.membership.role.epoch, a.tk
    (w,) = a.read(1)
    name = f"{epoch}.0.0"
    r.hset(tk.steps, f"{name}.0", f'["{w.stream}", "{w.entry_id}", {w.index}]')
    r.script_flush()
    r.script_load(a.scripts.source("settle"))
    own = [(w.entry_id, w.index or 0, "null")]
    batch: list[calls.Call[Any]] = [
        calls.step(tk, "a", name, "commit", 1, epoch=epoch),
        calls.settle(tk, w.stream, "a", time.time(), own, only_if=(name, "commit")),
    ]
    line = Line.of(r)
    assert line is not None
    packed = b"".join(
        pack_any("EVALSHA", a.scripts.sha(c.name), len(c.keys), *c.keys, *c.args) for c in batch
    )
    raw = line.send_all(packed, len(batch)).replies()
    line.close()
    assert isinstance(raw[0], NoScriptError) and raw[1][:2] == [0, 0]  # settled nothing
    end, _ = read_replies(a.scripts, batch, raw)
    assert end.decision == "commit"
    assert r.xpending(tk.stream, tk.group)["pending"] == 0
    assert int(r.hget(tk.record, "done") or 0) == 1
