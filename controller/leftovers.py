"""The leader's walks of finished queues' unfinished jobs, so their keys expire with them.

A released queue's keys expire (``controller.writes``: ``TaskKeys.all``, aside streams,
wait lists), and, in the same writes, the queue goes into ``qw:queues:expiring`` (score:
when its keys expire). The keys of its jobs that never finished (their records, a deferred
job's dependency set, a unique key a job holds) are named by no list: ``job_keys`` finds
them through what the queue indexes and gives them the record's expiry, ``BATCH`` jobs a
script call. A queue can hold millions of jobs, so a walk goes on over many passes,
``TRIPS`` round trips a pass at most, and the loop does not block on events while one is
under way. When it ends the queue leaves the index (``zrem_if``, fenced: only if it was not
released again meanwhile).

The index is read (``LISTED`` entries) when a term starts, when a pass saw a task end,
and every ``LOOK`` s; so a walk that a previous leader left half done is taken up again by
the next (giving a key the record's expiry twice is the same as once). An entry whose
keys have expired by now is dropped unwalked. A walk that meets an error reply (a key of
the wrong type, written by hand) is logged and dropped for the term.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.queue.job_keys import plan_job_keys
from queueworks.scripts.bound import Scripts
from queueworks.transport.connection import Connection
from queueworks.transport.plans import Plan, Trip
from queueworks.transport.runner import send_trip

from .fence import Batch, Fence
from .tally import Tally

TRIPS = 8  # round trips of walks one pass makes at most (each at most a job_keys.BATCH)
LISTED = 100  # index entries read at a look
LOOK = 5.0  # s: the index is read at least this often (a walk another leader left)


@dataclass
class Walk:
    queue: str
    score: float  # its entry's score as read: the one the walk removes at its end
    plan: Plan[int]
    reply: Any = None  # what to send the plan next


class Leftovers:
    def __init__(
        self,
        r: Connection,
        keys: Keys,
        scripts: Scripts,
        fence: Fence,
        log: Any,
        tally: Tally,
        held: Callable[[], bool],
    ) -> None:
        self.r, self.keys, self.scripts, self.fence = r, keys, scripts, fence
        self.log, self.tally, self.held = log, tally, held
        self.walks: dict[str, Walk] = {}
        self.failed: set[str] = set()  # queues whose walk met an error this term
        self.looked = -math.inf  # monotonic s of the last read of the index

    def reset(self) -> None:
        """Forget the walks (a new term, a Redis outage): the index is read again."""
        self.walks, self.failed, self.looked = {}, set(), -math.inf

    def wait(self) -> float:
        """How long the loop may block on events before this has something to do."""
        if self.walks:
            return 0.0
        return max(0.0, self.looked + LOOK - time.monotonic())

    def step(self, ended: bool) -> int:
        """Read the index if due (or a task ended: ``ended``), then walk on: the round
        trips made."""
        if ended or time.monotonic() - self.looked >= LOOK:
            self._look()
        trips = 0
        while self.walks and trips < TRIPS:
            walk = next(iter(self.walks.values()))
            trips += self._advance(walk, TRIPS - trips)
        return trips

    def _look(self) -> None:
        self.looked = time.monotonic()
        entries: Any = self.r.zrange(self.keys.queues_expiring, 0, LISTED - 1, withscores=True)
        self.tally.commands += 1
        now, gone = time.time(), Batch()
        for raw, score in entries:
            queue = text(raw)
            if score <= now:  # its keys have expired: nothing left to walk
                gone.add("zrem_if", [self.keys.queues_expiring], queue, score)
            elif queue not in self.failed:
                walk = self.walks.get(queue)
                if walk is None or walk.score != score:  # new, or released again since
                    plan = plan_job_keys(self.keys.task(queue))
                    self.walks[queue] = Walk(queue, score, plan)
        if len(gone):
            self.fence.apply_held(gone, self.held)

    def _advance(self, walk: Walk, budget: int) -> int:
        """Up to ``budget`` round trips of ``walk``; how many it made."""
        for made in range(budget):
            try:
                trip: Trip = walk.plan.send(walk.reply)  # type: ignore[assignment]
            except StopIteration as stop:
                self._ended(walk, stop.value)
                return made
            try:
                walk.reply = send_trip(self.r, self.scripts, trip)
            except redis.ResponseError as exc:  # a key written by hand: leave it be
                self.log.warning("leftovers_failed", task_id=walk.queue, error=str(exc))
                self.failed.add(walk.queue)
                del self.walks[walk.queue]
                return made + 1
            self.tally.commands += len(trip)
        return budget

    def _ended(self, walk: Walk, jobs: int) -> None:
        del self.walks[walk.queue]
        batch = Batch()
        batch.add("zrem_if", [self.keys.queues_expiring], walk.queue, walk.score)
        self.fence.apply_held(batch, self.held)
        self.log.info("leftovers_expiring", task_id=walk.queue, jobs=jobs)
