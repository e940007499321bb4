"""What the leader says when Redis lost its data under it (a restart without persistence, a
``FLUSHALL``, a failover to an empty replica): ``controller.lease`` finds that out when the
lease goes, and this says it once, with the schedules that went with the data.

Everything else recovers on its own: workers register again and rejoin what is there, a
client's queue handle makes its queue again, the next leader reads the state afresh. A
schedule is only a client's word, though, and nothing makes it again: so the leader keeps
the names in the schedule index (``qw:schedules``), read when its term starts and when a
schedule is written, and when the data is lost it logs, once, those whose definitions went
with it, for an operator to schedule them again.
"""

from __future__ import annotations

from typing import Any

from queueworks.protocol.keys import Keys
from queueworks.queue import schedules as sched
from queueworks.transport.connection import Connection

from .tally import Tally

NAMED = 100  # schedules named in the log line at most (the count says how many in all)


class Emptied:
    def __init__(self, r: Connection, keys: Keys, log: Any, tally: Tally) -> None:
        self.r, self.keys, self.log, self.tally = r, keys, log, tally
        self.known: set[tuple[str, str]] = set()  # (queue, name) of the index, last read

    def read(self) -> None:
        """Know the schedules the index holds now (a term starts, a schedule was written)."""
        self.tally.commands += 1
        members: Any = self.r.zrange(self.keys.schedules, 0, -1)
        found = (sched.split_member(m) for m in members)
        self.known = {where for where in found if where is not None}

    def lost(self) -> None:
        """Redis lost its data: say so, and name the known schedules whose definitions are
        gone (once: they are known no more)."""
        known = sorted(self.known)
        pipe = self.r.pipeline(transaction=False)
        for queue, name in known:
            pipe.hexists(self.keys.task(queue).schedules, name)
        there = self.tally.run(pipe) if known else []
        gone = [where for where, kept in zip(known, there, strict=True) if not kept]
        self.known -= set(gone)
        self.log.warning(
            "redis_emptied",
            reason="the lease's term counter went back: Redis lost its data",
            schedules_lost=len(gone),
        )
        if gone:
            self.log.warning(
                "schedules_lost",
                count=len(gone),
                schedules=[sched.member(queue, name) for queue, name in gone[:NAMED]],
                hint="schedule them again (Queue.schedule, queueworks schedule)",
            )
