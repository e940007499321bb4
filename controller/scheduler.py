"""The leader's periodic jobs: fire every schedule that is due, one job per due time.

A pass reads the global index (``qw:schedules``) once and only when it may hold something
due: the earliest entry's time is kept in memory, and read again when that time comes, when
an event says a schedule was written (``schedules``), and at least every ``RECHECK`` s. With
nothing due a pass costs nothing or one ``ZRANGE 0 0``, however many schedules there are.

What is due (up to ``BATCH`` schedules at a time) fires through the fence
(``controller.fence``): per due time a ``fire`` op (``fire_schedule.lua``, in the queue's
slot) and, only if the schedule's last one fired, a ``zadd`` of the index to the next due
time (the index's slot). The fire op checks the queue's own copy of the due time, so a stale
index entry (a replay, a tick of an older leader) never fires twice; such an entry is then
set to the queue's copy, or dropped if the schedule is gone (``zrem_if``: only if nobody
wrote it again meanwhile).

Every due time that passes while this leader watches fires, each with its own job, however
late a pass is: a pass that finds several of one schedule's due times passed fires them all
(a chain of fire ops, each advancing the queue's copy to the next), up to ``FIRE_LIMIT`` a
pass. Due times that passed before it watched (``since_ms``: its term's first pass, or the
first after a Redis outage) were missed while no controller ran: one catch-up run for them.

The controller wakes for the next due time on its own clock (``wake``): Redis notices the
end of an ``XREAD BLOCK`` only at its next cron tick (up to 1/hz s late, 0.1 s at the
default ``hz 10``), so the read for events stops blocking ``SLACK`` s before a due time and
the rest is slept here, reading events every ``POLL`` s meanwhile.

The queues' own copies are the truth, the index a copy a client writes after them (on a
cluster in another slot, so not atomically): at the first pass of each term the leader
writes every queue's due times into the index again (``restore``), so a schedule whose
client died between the two writes fires anyway, one term later at the latest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.queue import schedules as sched
from queueworks.transport.connection import Connection

from .fence import Batch, Fence
from .tally import Tally

BATCH = 500  # due schedules fired per script call round
ROUNDS = 4  # index reads of one pass at most (a pass must not run on for long)
RECHECK = 1.0  # s: the index is read at least this often (a missed event costs this much)
FIRE_LIMIT = 100  # due times of one schedule fired in one pass at most
SLACK = 0.15  # s: so long before a due time the read for events no longer blocks in Redis
POLL = 0.01  # s: meanwhile, events are read this often


def wake(wait: float, due_in: float) -> tuple[int, float]:
    """How a pass waits ``wait`` s for events while a schedule is due in ``due_in`` s: the
    ``XREAD BLOCK`` in ms (0: none) and then a sleep on this process's clock, in s. A block
    must end ``SLACK`` s before the due time at the latest: Redis may end it late by that."""
    if due_in >= wait + SLACK:
        return max(1, int(wait * 1000)), 0.0
    if due_in > SLACK:
        return max(1, int((due_in - SLACK) * 1000)), 0.0
    return 0, min(due_in, POLL)


class Scheduler:
    def __init__(
        self,
        r: Connection,
        keys: Keys,
        fence: Fence,
        log: Any,
        tally: Tally,
        held: Callable[[], bool],
    ) -> None:
        self.r, self.keys, self.fence, self.log, self.tally = r, keys, fence, log, tally
        self.held = held
        self.next_at = 0.0  # s: the earliest due time read (inf: none)
        self.read_at = -math.inf  # monotonic s of the last read of the index
        self.restored = False  # the index was written from the queues' copies this term
        self.since_ms = 0  # since when this leader has watched without a break (ms)

    def reset(self) -> None:
        """Read the index again at the next pass (a new term, a Redis outage), and
        restore it from the queues' copies first."""
        self.next_at, self.read_at = 0.0, -math.inf
        self.restored = False

    def restore(self) -> int:
        """Write every queue's schedules' due times into the index (the queues' own copies
        are the truth); the number of schedules. Once per term: a read per queue."""
        names = sorted(text(n) for n in self.r.smembers(self.keys.queues))
        pipe = self.r.pipeline(transaction=False)
        for queue in names:
            pipe.zrange(self.keys.task(queue).schedules_due, 0, -1, withscores=True)
        found = self.tally.run(pipe) if names else []
        batch = Batch()
        for queue, due in zip(names, found, strict=True):
            for name, score in due:
                batch.add(
                    "zadd", [self.keys.schedules], int(score), sched.member(queue, text(name))
                )
        if len(batch):
            self.fence.apply_held(batch, self.held)
        self.restored = True
        return len(batch)

    def due_in(self, now: float) -> float:
        """Seconds until the earliest due time read (inf: none)."""
        return max(0.0, self.next_at - now)

    def wait(self, now: float) -> float:
        """Seconds until the next pass should look at the index."""
        return max(0.0, min(self.next_at - now, self.read_at + RECHECK - time.monotonic()))

    def step(self, woken: bool = False) -> int:
        """Fire what is due; the number of jobs fired. ``woken``: a schedule was written."""
        if not self.restored:
            self.since_ms = round(time.time() * 1000)
            self.restore()
            woken = True
        now = time.time()
        if not woken and now < self.next_at and time.monotonic() - self.read_at < RECHECK:
            return 0
        fired = 0
        for _ in range(ROUNDS):
            self.read_at = time.monotonic()
            now_ms = round(time.time() * 1000)
            self.tally.commands += 1
            head: Any = self.r.zrange(self.keys.schedules, 0, 0, withscores=True)
            if not head or head[0][1] > now_ms:
                self.next_at = head[0][1] / 1000 if head else math.inf
                return fired
            self.tally.commands += 1
            due: Any = self.r.zrangebyscore(
                self.keys.schedules, "-inf", now_ms, start=0, num=BATCH, withscores=True
            )
            fired += self._fire(due, now_ms)
        self.next_at = 0.0  # more is due than a few rounds fire: go on at the next pass
        return fired

    def _fire(self, due: list[tuple[bytes, float]], now_ms: int) -> int:
        entries = [(sched.split_member(m), m, int(score)) for m, score in due]
        found = [(where, m, s) for where, m, s in entries if where is not None]
        batch = Batch()
        for where, m, _ in entries:
            if where is None:  # no schedule can be named so: written by hand
                batch.add("zrem", [self.keys.schedules], text(m))
        pipe = self.r.pipeline(transaction=False)
        for (queue, name), _, _ in found:
            pipe.hget(self.keys.task(queue).schedules, name)
        defs = self.tally.run(pipe) if found else []
        tried: list[tuple[str, str, bytes, int, range]] = []  # queue, name, member, due, ops
        for ((queue, name), m, due_ms), raw in zip(found, defs, strict=True):
            try:
                d = sched.decode(raw) if raw is not None else None
            except ValueError as exc:
                self.log.warning("schedule_unreadable", queue=queue, schedule=name, error=str(exc))
                d = None
            if d is None:  # unscheduled meanwhile, or unusable: drop it unless written again
                batch.add("zrem_if", [self.keys.task(queue).schedules_due], name, due_ms)
                batch.add("zrem_if", [self.keys.schedules], text(m), due_ms)
                continue
            ops = self._add_fire(batch, queue, name, d, due_ms, now_ms)
            tried.append((queue, name, m, due_ms, ops))
        replies = self.fence.apply_held(batch, self.held)
        stale = [(q, n, m, due_ms) for q, n, m, due_ms, ops in tried if not replies[ops[-1] - 1]]
        if stale:
            self._repair(stale)
        fired = sum(replies[op - 1] for *_, ops in tried for op in ops)
        self.tally.fired += fired
        return fired

    def _add_fire(
        self, batch: Batch, queue: str, name: str, d: sched.Definition, due_ms: int, now_ms: int
    ) -> range:
        """The ops that fire a schedule's due times passed (and move the index on if the
        last fired): the fire ops' numbers. Each fires only if the one before it did: it
        checks the queue's copy of the due time that one advanced it to."""
        qk = self.keys.task(queue)
        fires, next_ms = sched.fire_times(d, due_ms, max(now_ms, due_ms), self.since_ms, FIRE_LIMIT)
        unit, first, check = batch.unit(), len(batch) + 1, due_ms
        for n, fire_ms in enumerate(fires):
            after = fires[n + 1] if n + 1 < len(fires) else next_ms
            job = sched.job_id(queue, name, fire_ms)
            keys = [qk.record, qk.stream, qk.schedules, qk.schedules_due, qk.schedules_last]
            keys.append(qk.job(job))
            args = (name, check, after, job, repr(fire_ms / 1000), d.handler, d.payload, d.options)
            last = batch.add("fire", keys, *args, unit=unit)
            check = after
        member = sched.member(queue, name)
        batch.add("zadd", [self.keys.schedules], next_ms, member, when=last, stage=1)
        return range(first, last + 1)

    def _repair(self, stale: list[tuple[str, str, bytes, int]]) -> None:
        """Index entries that fired nothing: set each to its queue's own due time, or drop
        it if the schedule is gone (and the entry is still the one read)."""
        pipe = self.r.pipeline(transaction=False)
        for queue, name, _, _ in stale:
            pipe.zscore(self.keys.task(queue).schedules_due, name)
        truth = self.tally.run(pipe)
        batch = Batch()
        for (_, _, m, due_ms), score in zip(stale, truth, strict=True):
            if score is None:
                batch.add("zrem_if", [self.keys.schedules], text(m), due_ms)
            else:
                batch.add("zadd", [self.keys.schedules], int(score), text(m))
        self.fence.apply(batch)
