"""One member's side of the membership protocol (see docs/architecture.md): join, take the
role the sorted member list gives, the partition barrier, the epoch fence, leave.

Writes go through the Lua scripts (``join.lua``, ``depart.lua``); the roster is read with
``queueworks.membership.read_roster``. ``NodeState`` is what the heartbeat and the watcher
share with the member: they flag a new epoch (``suspend``) or a prune (``fenced``); the
member acts on it at its next safe point.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from queueworks import events
from queueworks.connection import Connection
from queueworks.keys import Keys, TaskKeys
from queueworks.membership import Roster, read_roster
from queueworks.models import Role
from queueworks.records import idle_worker, member_of
from queueworks.scripts import Scripts
from workers.heartbeat import NodeState

HISTORY_MAXLEN = 1000


class Membership:
    def __init__(
        self,
        r: Connection,
        scripts: Scripts,
        tk: TaskKeys,
        keys: Keys,
        state: NodeState,
        *,
        ttl: float,
        log: Any,
    ) -> None:
        self.r, self.scripts, self.tk, self.keys, self.state = r, scripts, tk, keys, state
        self.ttl_ms, self.log = int(ttl * 1000), log
        self.me = state.worker_id
        self.role: Role | None = None

    def join(self) -> bool:
        """Add us to the node set (a new epoch); False if the task is missing or finished."""
        self.state.suspend.clear()
        self.state.fenced = False
        epoch = self.scripts.join(self.tk, self.me, self.ttl_ms, time.time())
        if epoch < 0:
            return False
        self.state.role_epoch = self.state.epoch_seen = epoch  # epochs are per task
        self.state.task_id = self.tk.task_id
        self.log.info("joined", epoch=epoch)
        return True

    def take_role(self) -> Roster | None:
        """Read the roster and take our role from it (``self.role``); None if we are no
        longer a member (pruned while away: fenced)."""
        self.state.suspend.clear()
        roster = read_roster(self.r, self.tk)
        role = roster.role_of(self.me)
        if role is None:
            self.state.fenced = True
            return None
        self.state.role_epoch = roster.epoch
        self.role = role
        return roster

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

    def publish(self) -> Any:
        """Our role into our worker hash; for the leader, also the latest history entry
        (the membership change this rebalance answers, for ``record_rebalance``)."""
        role = self.role
        assert role is not None
        pipe = self.r.pipeline(transaction=False)
        member = member_of(self.tk.task_id, role.rank, role.epoch)
        pipe.hset(self.keys.worker(self.me), mapping=member)
        if role.leader:
            pipe.xrevrange(self.tk.history, count=1)
        replies = pipe.execute()
        return replies[1] if role.leader else None

    def record_rebalance(self, pause_ms: float, reclaimed: int, last: Any) -> None:
        """The leader writes one history entry per rebalance: how long the members paused,
        what was reclaimed, and how long after the membership change (``last``, the latest
        history entry when the rebalance began) it was all done."""
        role = self.role
        assert role is not None
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
            maxlen=HISTORY_MAXLEN,
            approximate=True,
        )

    def fence(self, score: Any, epoch: Any) -> bool:
        """What a read's membership check found (our ZSCORE, the epoch): flag a prune or a
        new epoch; True if anything changed."""
        assert self.role is not None
        changed = score is None or int(epoch or 0) != self.role.epoch
        if score is None:
            self.state.fenced = True
        elif changed:
            self.state.observe_epoch(int(epoch or 0))
        return changed

    def leave(self) -> int:
        """Remove us from the node set (a new epoch for the others, at once); our worker
        hash says idle again. Returns the new epoch, 0 if we were no member any more."""
        self.state.task_id = None
        epoch = self.scripts.depart(self.tk, self.me, time.time(), "leave", only_if_dead=False)
        self.r.hset(self.keys.worker(self.me), mapping=idle_worker())
        if epoch:
            events.emit(self.r, self.keys, "member_left", task=self.tk.task_id, worker=self.me)
        self.log.info("left", epoch=epoch)
        return epoch
