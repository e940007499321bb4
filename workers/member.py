"""One member's side of the membership protocol (see docs/architecture.md): join, take the
role the sorted member list gives, the partition barrier, the epoch fence, leave.

Writes go through the Lua scripts (``join.lua``, ``depart.lua``); a join returns the roster
at its epoch, so the joiner takes its role without reading it again; later the roster is
read with the latest history entry, in one MULTI. ``Seat`` is what the heartbeat and
the watcher share with the member: they flag a new epoch (``suspend``) or a prune
(``fenced``); the member acts on it at its next safe point.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import NoScriptError

from queueworks.protocol import events
from queueworks.protocol.keys import Keys, TaskKeys
from queueworks.protocol.membership import Roster, roster_of
from queueworks.protocol.models import Role
from queueworks.protocol.records import idle_worker, member_of
from queueworks.scripts import calls
from queueworks.scripts.bound import Joined, Queued, Scripts, fields_of
from queueworks.transport.connection import Connection

from .heartbeat import Seat

HISTORY_MAXLEN = 1000

# Reads for a join's pipeline, ahead of it: it queues them, returns what reads their replies
Before = Callable[[Any], Callable[[list[Any]], None]]


def upgrade_groups(pipe: Any, streams: Sequence[str], group: str) -> None:
    """Give ``streams`` the consumer group if they lack it (its replies are ignored: an
    existing group, or no stream, is an error reply). A stream written by a version whose
    group was named after its task has none: the new group starts at the beginning, so
    whatever is still in the stream is read again (a queue's stream holds only jobs not yet
    settled; a task's settled subtasks are counted once, whoever runs them again)."""
    for stream in streams:
        pipe.xgroup_create(stream, group, id="0")


class Membership:
    def __init__(
        self,
        r: Connection,
        scripts: Scripts,
        tk: TaskKeys,
        keys: Keys,
        state: Seat,
        *,
        ttl: float,
        log: Any,
    ) -> None:
        self.r, self.scripts, self.tk, self.keys, self.state = r, scripts, tk, keys, state
        self.ttl_ms, self.log = int(ttl * 1000), log
        self.me = state.worker_id
        self.role: Role | None = None
        self.checked_at = 0.0  # monotonic time our membership and epoch were last read
        self._joined: tuple[int, float] | None = None  # (epoch, time) of our join
        self._changed_at: float | None = None  # when the membership last changed (time)

    def join(
        self,
        before: Before | None = None,
        read: tuple[str, int] | None = None,
        streams: Sequence[str] = (),
        most: int | None = None,
    ) -> Joined | None:
        """Add us to the node set (a new epoch): the roster at that epoch, and with
        ``read`` (stream, count) up to count new entries of that stream read as the new
        member; None if the task is missing or finished. ``before`` puts reads on the
        join's pipeline, ahead of it (one round trip for all), and returns what reads their
        replies; that is only called if we joined. ``streams``: the task's streams, given
        the consumer group if they lack it (see ``upgrade_groups``); ``most``: the node set's
        bound (``NodeSetFull`` is raised if it holds that many without us)."""
        self.state.suspend.clear()
        self.state.halt.clear()
        self.state.fenced = False
        now, sent = time.time(), time.monotonic()
        pipe = self.r.pipeline(transaction=False)
        if self.state.queue:  # recorded before we may hold a job of it (``workers.lost``)
            pipe.sadd(self.keys.worker_queues(self.me), self.tk.task_id)
        upgrade_groups(pipe, streams, self.tk.group)
        read_before = before(pipe) if before is not None else None
        stream, count = read if read is not None else (None, 0)
        call = calls.join(self.tk, self.me, self.ttl_ms, now, stream=stream, count=count, most=most)
        joining = Queued(self.scripts, call, pipe)
        replies = pipe.execute(raise_on_error=False)
        joined = joining.reply(replies)
        if joined is None:
            return None
        if read_before is not None:
            read_before(replies)
        roster = joined.roster
        self.state.role_epoch = self.state.epoch_seen = roster.epoch  # epochs are per task
        self.state.task_id = self.tk.task_id
        self.checked_at = sent
        self._joined = (roster.epoch, now)
        self.log.info("joined", epoch=roster.epoch)
        return joined

    def take_role(
        self, roster: Roster | None = None, read: tuple[Roster, float] | None = None
    ) -> Roster | None:
        """Take our role from ``roster`` (the one our join returned), from ``read`` (a
        roster ``roster_on`` read just now, and the monotonic time it was sent) or, without
        either, from the roster read now (``self.role``); None if we are no longer a member
        (pruned while away: fenced). Also notes when the membership last changed (for
        ``publish``)."""
        self.state.suspend.clear()
        sent = self.checked_at
        if roster is not None and self._joined is not None and self._joined[0] == roster.epoch:
            self._changed_at = self._joined[1]  # our own join is that change
        elif read is not None:
            roster, sent = read
        else:
            sent = time.monotonic()
            roster = self._read_roster()
        self._joined = None
        role = roster.role_of(self.me)
        if role is None:
            self.state.pruned()
            return None
        self.state.role_epoch = roster.epoch
        self.checked_at = sent
        self.role = role
        return roster

    def _read_roster(self) -> Roster:
        """Epoch, members and the latest history entry, in one MULTI (so they agree)."""
        pipe = self.r.pipeline(transaction=True)
        read = self.roster_on(pipe)
        return read(pipe.execute())

    def roster_on(self, pipe: Any) -> Callable[[list[Any]], Roster]:
        """Put the roster's reads on ``pipe`` (a MULTI: so they agree); returns what reads
        it from the replies (an error reply is raised)."""
        at = len(pipe)
        pipe.get(self.tk.epoch)
        pipe.zrange(self.tk.members, 0, -1, withscores=True)
        pipe.xrevrange(self.tk.history, count=1)

        def read(replies: list[Any]) -> Roster:
            epoch, members, last = replies[at : at + 3]
            for reply in (epoch, members, last):
                if isinstance(reply, Exception):
                    raise reply
            self._changed_at = None  # no change since the last rebalance was recorded
            if last:
                fields = last[0][1]
                if isinstance(fields, list):  # a cluster's MULTI leaves the reply unparsed
                    fields = fields_of(fields)
                if fields.get(b"cause") != b"rebalanced":
                    self._changed_at = float(fields[b"ts"])
            return roster_of(epoch, members)

        return read

    def current(self, roster: Roster) -> bool:
        """True if no newer epoch than ``roster``'s has been seen meanwhile."""
        return self.state.epoch_seen <= roster.epoch

    def settle_wakeup(self) -> None:
        """Clear a wake-up for the epoch we just took (it is stale), unless there is a real
        reason to stop."""
        s = self.state
        if s.epoch_seen <= s.role_epoch and not (
            s.stopping or s.fenced or s.assign != self.tk.task_id
        ):
            s.suspend.clear()

    def owned(self, streams: Sequence[str]) -> list[str]:
        """Partitioned tasks: the partitions our rank owns (``k % world_size == rank``)."""
        assert self.role is not None
        n, rank = self.role.world_size, self.role.rank
        return [s for k, s in enumerate(streams) if k % n == rank]

    def barrier(self, roster: Roster) -> bool:
        """Confirm the epoch and wait until every member has, so no partition is read by
        two members in one epoch. False if the set changed again meanwhile (start over)."""
        self.r.hset(self.tk.confirm, self.me, roster.epoch)
        while True:
            confirmed = self.r.hmget(self.tk.confirm, list(roster.members))
            if all(c is not None and int(c) >= roster.epoch for c in confirmed):
                return True
            if self.state.epoch_seen > roster.epoch or self.state.fenced:
                return False
            if self.state.stopping or self.state.assign != self.tk.task_id:
                return True  # leaving anyway; the next check raises Leave
            self.state.wake.wait(0.01)
            self.state.wake.clear()
            self.state.observe_epoch(int(self.r.get(self.tk.epoch) or 0))

    def publish(self, pause_ms: float, reclaimed: int) -> None:
        """Our role into our worker hash, in one round trip with, for the leader, the
        history entry of this rebalance: how long the members paused, what was reclaimed,
        and how long after the membership change it answers (when ``take_role`` saw it) it
        was all done."""
        role = self.role
        assert role is not None
        pipe = self.r.pipeline(transaction=False)
        if not self.state.queue:  # (a queue's seat: the worker's queue set says it)
            member = member_of(self.tk.task_id, role.rank, role.epoch)
            pipe.hset(self.keys.worker(self.me), mapping=member)
        if role.leader:
            now = time.time()
            since_change_ms = ""
            if self._changed_at is not None:
                since_change_ms = str(round((now - self._changed_at) * 1000, 1))
            pipe.xadd(
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
                maxlen=HISTORY_MAXLEN,
                approximate=True,
            )
        pipe.execute()

    def fence(self, score: Any, epoch: Any, sent: float | None = None) -> bool:
        """What a read's membership check found (our ZSCORE, the epoch; ``sent``: the
        monotonic time the check was sent): flag a prune or a new epoch; True if anything
        changed."""
        assert self.role is not None
        self.checked_at = time.monotonic() if sent is None else sent
        changed = score is None or int(epoch or 0) != self.role.epoch
        if score is None:
            self.state.pruned()
        elif changed:
            self.state.observe_epoch(int(epoch or 0))
        return changed

    def leave(self, first: Callable[[Any], None] | None = None) -> int:
        """Remove us from the node set (a new epoch for the others, at once); our worker
        hash says idle again. Returns the new epoch, 0 if we were no member any more.

        One round trip: ``first`` puts what must go before on the pipeline (the task's end
        event), and the ``member_left`` event rides with the departure unless we know we
        were pruned (then only if the departure still found us a member). A member pruned
        without knowing it sends one too: the controller just reads that worker and task
        again."""
        self.state.task_id = None
        pipe = self.r.pipeline(transaction=False)
        if first is not None:
            first(pipe)
        call = calls.depart(self.tk, self.me, time.time(), "leave", only_if_dead=False)
        departing = Queued(self.scripts, call, pipe)
        if self.state.queue:  # (what we held is handed back: nothing of ours is left there)
            pipe.srem(self.keys.worker_queues(self.me), self.tk.task_id)
        else:
            pipe.hset(self.keys.worker(self.me), mapping=idle_worker())
        done = self.state.node.unreported()  # what this run settled, in the record now
        pipe.hincrby(self.keys.worker(self.me), "processed", done)
        pruned = self.state.fenced
        if not pruned:
            events.emit(pipe, self.keys, "member_left", task=self.tk.task_id, worker=self.me)
        try:
            replies = pipe.execute(raise_on_error=False)
        except BaseException:
            self.state.node.unreport(done)
            raise
        epoch = departing.reply(replies)
        for reply in replies:
            if isinstance(reply, Exception) and not isinstance(reply, NoScriptError):
                raise reply
        if epoch and pruned:
            events.emit(self.r, self.keys, "member_left", task=self.tk.task_id, worker=self.me)
        self.log.info("left", epoch=epoch)
        return epoch
