"""The membership protocol's read side: the sorted member list and the roles it gives.

Writes (join, leave, prune) are Lua scripts (``join.lua``, ``depart.lua``) called through
``queueworks.scripts.bound``; see docs/architecture.md, "The membership protocol".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from queueworks.protocol.keys import TaskKeys
from queueworks.protocol.messages import text
from queueworks.protocol.models import Role

if TYPE_CHECKING:
    from queueworks.transport.connection import Connection


@dataclass(frozen=True)
class Roster:
    """Members of one task at one epoch, in rank order (join sequence, then worker id)."""

    epoch: int
    members: tuple[str, ...]

    def role_of(self, worker_id: str) -> Role | None:
        try:
            rank = self.members.index(worker_id)
        except ValueError:
            return None
        return Role(rank=rank, world_size=len(self.members), epoch=self.epoch)

    def successor(self, worker_id: str) -> str | None:
        """The member this one watches: the next in rank order, wrapping around.

        Each member checks one other per tick, so detection costs O(members) per task.
        """
        if len(self.members) < 2 or worker_id not in self.members:
            return None
        i = self.members.index(worker_id)
        return self.members[(i + 1) % len(self.members)]


def read_roster(r: Connection, tk: TaskKeys) -> Roster:
    """Read members and epoch together (one MULTI, so they agree)."""
    pipe = r.pipeline(transaction=True)
    pipe.get(tk.epoch)
    pipe.zrange(tk.members, 0, -1, withscores=True)
    epoch_raw, members = pipe.execute()
    return roster_of(epoch_raw, members)


def roster_of(epoch: Any, members: Sequence[tuple[Any, Any]]) -> Roster:
    """The roster from an epoch and ``(member, score)`` pairs as Redis gives them (the
    reply of ``ZRANGE ... WITHSCORES``, or ``join.lua``'s)."""
    ordered = sorted((float(score), text(wid)) for wid, score in members)
    return Roster(int(epoch or 0), tuple(wid for _, wid in ordered))
