"""The leader's count of wanted workers (``controller.wanted``), published for autoscalers.

Every ``interval`` s (1 by default) a pass reads what the mirror does not hold, in one
pipelined round trip: each active queue's stream lengths (its own and its priority bands'),
its delayed jobs already due and the next one's due time, and its settled counts; each task
that holds nodes, its settled counts. A task that holds none needs no read (it wants its
``min_nodes``). The rate one worker finishes items at is measured here, from the settled
counts of the last ``WINDOW`` s, and kept while a task or queue has no workers (so a
backlog after an idle spell asks for what it needs at once). With no active task or
queue, a pass reads nothing.

Up to ``READS_PER_PASS`` queues, a pass reads them all. Past that, it reads those never
read yet and those that had work at their last read (``BUSY_PER_PASS`` at most, in turn:
10,000 new queues are known in 5 s), those a job or a delayed job was added to since
(keyspace notifications of their streams and delayed sets, listened to from then on:
``listen``), those whose next delayed job is due, and ``ROTATE_PER_PASS`` of the others in
turn, a backstop for what a notification missed; the others count as last read. So 10,000
idle queues cost 50 reads a second, and a job on any of them is counted at the next pass.
Where notifications cannot be had (a cluster, a server that refuses CONFIG SET), the turn
is ``READS_PER_PASS`` a pass. A pass whose reads changed no count nor rate, while the
mirror's ``demand_version`` stayed, counts nothing again.

The result goes to ``qw:autoscale:wanted`` through the fence (``controller.fence``: only
while this controller leads), when it changes and at least every ``REFRESH`` s, with an
expiry of ``TTL`` s: when no controller leads, the value goes away and autoscalers hold.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from queueworks.protocol import wanted as published
from queueworks.protocol.keys import Keys
from queueworks.protocol.priorities import bands_of
from queueworks.transport.connection import Connection

from .fence import Batch, Fence
from .mirror import Mirror, TaskRow
from .tally import Tally
from .wanted import Need, wanted

REFRESH = 5.0  # s: the value is written again at least this often
TTL = 30.0  # s: its expiry (a value no leader refreshes goes away)
WINDOW = 10.0  # s of settled counts a rate is measured over
READS_PER_PASS = 200  # past this many tasks and queues, a pass reads some (see above)
BUSY_PER_PASS = 2000  # queues with work read per pass, at most (in turn past that)
ROTATE_PER_PASS = 50  # queues read per pass in turn, while notifications come
Sample = tuple[float, int]  # (monotonic s, items settled)


class Demand:
    def __init__(
        self,
        r: Connection,
        keys: Keys,
        fence: Fence,
        log: Any,
        tally: Tally,
        held: Callable[[], bool],
        *,
        me: str,
        target_s: float,
        interval: float,
    ) -> None:
        self.r, self.keys, self.fence, self.log, self.tally = r, keys, fence, log, tally
        self.held, self.me = held, me
        self.target_s, self.interval = target_s, interval
        self.at = -math.inf  # monotonic s of the last pass
        self.written: tuple[float, dict[str, int]] | None = None  # when, what
        self.samples: dict[str, deque[Sample]] = {}
        self.per_worker: dict[str, float] = {}  # the last rate measured, per task or queue
        self.counts: dict[str, tuple[int | None, int | None]] = {}  # as last read
        self.turn = 0  # where the next pass's reads start (with more than READS_PER_PASS)
        # the mirror and its ``demand_version`` the last count was made from, the rows it
        # sorted, those it reads, and that count: a pass whose reads changed nothing and
        # whose mirror did not change counts nothing again (10,000 idle queues cost their
        # reads alone)
        self.seen: tuple[Mirror, int] | None = None
        self.rows: list[TaskRow] = []
        self.readable: list[TaskRow] = []
        self.last: dict[str, int] = {}
        # past READS_PER_PASS: what a pass reads beside its turn (see the module docstring)
        self.listen: Callable[[], bool] = lambda: False  # subscribe; True if they come
        self.listening: bool | None = None  # None: not tried yet
        self.busy: set[str] = set()  # queues whose last read found work
        self.unread: set[str] = set()  # rows never read (an unknown queue counts as work)
        self.bands: dict[str, list[int]] = {}  # a queue's priority bands, as last read
        self.due_at: dict[str, float] = {}  # a queue's next delayed job's due time (epoch s)
        self._told: set[str] = set()  # queues notified of since the last pass
        self._told_lock = threading.Lock()
        self._blind = 0  # passes left that turn READS_PER_PASS (notifications were lost)

    def reset(self) -> None:
        """A new term: write again at the next pass (rates measured so far stay true)."""
        self.at, self.written = -math.inf, None

    def told(self, queues: Iterable[str] | None) -> None:
        """Jobs were added to ``queues`` (a notification; any thread): read them at the
        next pass. None: notifications may have been lost, read every queue in turn."""
        with self._told_lock:
            if queues is None:
                self._blind = -1
            else:
                self._told.update(queues)

    def wait(self) -> float:
        """Seconds until the next pass is due."""
        return max(0.0, self.at + self.interval - time.monotonic())

    def step(self, mirror: Mirror) -> dict[str, int] | None:
        """Count and publish, if due: what was written (None: nothing)."""
        now = time.monotonic()
        if now - self.at < self.interval:
            return None
        self.at = now
        seen = (mirror, mirror.demand_version)  # (a Mirror compares by identity)
        same = self.seen == seen
        if not same:
            self.rows = sorted(mirror.tasks.values(), key=lambda row: row.id)
            self.readable = [row for row in self.rows if row.queue or mirror.nodes.get(row.id)]
            self._forget(set(mirror.tasks))
            self.unread = {row.id for row in self.readable if row.id not in self.counts}
        changed = self._read(now, mirror)
        if same and not changed:
            counts = self.last
        else:
            counts = wanted(self._needs(mirror), self.target_s)
            self.seen, self.last = seen, counts
        if self.written and self.written[1] == counts and now - self.written[0] < REFRESH:
            return None
        value = published.Wanted(
            at=time.time(), by=self.me, target_s=self.target_s, selectors=counts
        )
        batch = Batch()
        batch.add("set_px", [self.keys.wanted], published.encode(value), int(TTL * 1000))
        self.fence.apply_held(batch, self.held)
        if self.written is None or self.written[1] != counts:
            self.log.info("wanted_workers", selectors=counts)
        self.written = (now, counts)
        return counts

    def _read(self, now: float, mirror: Mirror) -> bool:
        """Read this pass's tasks and queues (see the module docstring): their counts, and
        the rates measured from them. Whether any changed."""
        read = self._choose(mirror)
        if not read:
            return False
        pipe = self.r.pipeline(transaction=False)
        clock = time.time()
        for row in read:
            tk = self.keys.task(row.id)
            pipe.hmget(tk.record, "total", "done", "dead")
            if row.queue:
                pipe.xlen(tk.stream)
                for band in self.bands.get(row.id, ()):
                    pipe.xlen(tk.band(band))
                pipe.smembers(tk.bands)
                pipe.zcount(tk.scheduled, "-inf", clock)
                pipe.zrange(tk.scheduled, 0, 0, withscores=True)
        replies = iter(self.tally.run(pipe))
        changed = False
        for row in read:
            self.unread.discard(row.id)
            counts = self._work(row, replies)
            changed = changed or self.counts.get(row.id) != counts
            self.counts[row.id] = counts
            settled = counts[0]
            if settled is not None:
                nodes = len((mirror.members if row.queue else mirror.nodes).get(row.id, ()))
                rate = self.per_worker.get(row.id)
                self._measure(row.id, settled, nodes, now)
                changed = changed or self.per_worker.get(row.id) != rate
        return changed

    def _choose(self, mirror: Mirror) -> list[TaskRow]:
        """The rows this pass reads: all of them up to ``READS_PER_PASS``; past that, the
        busy, the told of, the due, and a turn of the others."""
        rows = self.readable
        with self._told_lock:
            told, self._told = self._told, set()
            if self._blind < 0:  # a resubscribe: a whole round at the blind rate
                self._blind = math.ceil(len(rows) / READS_PER_PASS)
            blind, self._blind = self._blind, max(0, self._blind - 1)
        if len(rows) <= READS_PER_PASS:
            return rows
        if self.listening is None:
            self.listening = self.listen()
        turn = ROTATE_PER_PASS if self.listening and not blind else READS_PER_PASS
        start = self.turn % len(rows)
        chosen = {row.id: row for row in (rows[start:] + rows[:start])[:turn]}
        self.turn = start + turn
        clock = time.time()
        due = (q for q, at in self.due_at.items() if at <= clock)
        extra = [*self.unread, *self.busy, *told, *due]
        if len(extra) > BUSY_PER_PASS:
            extra = sorted(set(extra))
            first = self.turn % len(extra)
            extra = (extra[first:] + extra[:first])[:BUSY_PER_PASS]
        for tid in extra:
            row = mirror.tasks.get(tid)
            if row is not None and tid not in chosen and (row.queue or mirror.nodes.get(tid)):
                chosen[tid] = row
        return list(chosen.values())

    def _work(self, row: TaskRow, replies: Any) -> tuple[int | None, int | None]:
        """(items settled, items left) from the reads of one task or queue (None:
        unknown); a queue's bands, next due time and whether it is busy, kept."""
        total, done, dead = (_int(v) for v in next(replies))
        settled = done + dead
        if not row.queue:
            if total <= 0:
                return settled, None  # a step task, or no total yet
            return settled, max(0, total - settled)
        length = _int(next(replies)) + sum(_int(next(replies)) for _ in self.bands.get(row.id, ()))
        bands = bands_of(next(replies))
        due, first = _int(next(replies)), next(replies)
        left = length + due
        tid = row.id
        new_bands = bands != self.bands.get(tid, [])  # (their lengths: read next pass)
        if bands:
            self.bands[tid] = bands
        else:
            self.bands.pop(tid, None)
        if first and due == 0:
            self.due_at[tid] = float(first[0][1])
        else:
            self.due_at.pop(tid, None)
        if left or new_bands:
            self.busy.add(tid)
        else:
            self.busy.discard(tid)
        return settled, left

    def _needs(self, mirror: Mirror) -> list[Need]:
        readable = {row.id for row in self.readable}  # (a task without nodes needs no read)
        needs = []
        for row in self.rows:
            work = self.counts.get(row.id, (None, None))[1] if row.id in readable else None
            needs.append(
                Need(
                    id=row.id,
                    selector=published.selector_name(row.selector),
                    queue=row.queue,
                    min_nodes=row.min_nodes,
                    max_nodes=row.max_nodes,
                    work=work,
                    per_worker=self.per_worker.get(row.id),
                    partitions=row.partitions,
                    priority=row.priority,
                )
            )
        return needs

    def _measure(self, tid: str, settled: int, nodes: int, now: float) -> None:
        """Keep the settled count; measure one worker's rate over the window, if it ran."""
        seen = self.samples.setdefault(tid, deque())
        seen.append((now, settled))
        while len(seen) > 2 and now - seen[1][0] >= WINDOW:
            seen.popleft()
        first_at, first = seen[0]
        if nodes and now - first_at >= 1.0 and settled > first:
            self.per_worker[tid] = (settled - first) / (now - first_at) / nodes

    def _forget(self, active: set[str]) -> None:
        for tid in [t for t in self.counts if t not in active]:
            del self.counts[tid]
        for tid in [t for t in self.samples if t not in active]:
            del self.samples[tid]
        for tid in [t for t in self.per_worker if t not in active]:
            del self.per_worker[tid]
        for kept in (self.bands, self.due_at):
            for tid in [t for t in kept if t not in active]:
                del kept[tid]
        self.busy &= active


def _int(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0
