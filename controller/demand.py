"""The leader's count of wanted workers (``controller.wanted``), published for autoscalers.

Every ``interval`` s (1 by default) a pass reads what the mirror does not hold, in one
pipelined round trip: each active queue's stream length, the jobs its members hold and
its delayed jobs already due; each task that holds nodes, its settled counts. A task that
holds none needs no read (it wants its ``min_nodes``). The rate one worker finishes items
at is measured here, from the settled counts of the last ``WINDOW`` s, and kept while a
task or queue has no workers (so a backlog after an idle spell asks for what it needs at
once). With no active task or queue, a pass reads nothing. A pass reads at most
``READS_PER_PASS`` of them, in turn, and counts the others as last read: with many queues
its cost stays level, and each is read again every ``n / READS_PER_PASS`` passes. A pass
whose reads changed no count nor rate, while the mirror's ``demand_version`` stayed, counts
nothing again: idle, the count costs its reads alone, however many queues there are.

The result goes to ``qw:autoscale:wanted`` through the fence (``controller.fence``: only
while this controller leads), when it changes and at least every ``REFRESH`` s, with an
expiry of ``TTL`` s: when no controller leads, the value goes away and autoscalers hold.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from queueworks.protocol import wanted as published
from queueworks.protocol.keys import Keys
from queueworks.transport.connection import Connection

from .fence import Batch, Fence
from .mirror import Mirror, TaskRow
from .tally import Tally
from .wanted import Need, wanted

REFRESH = 5.0  # s: the value is written again at least this often
TTL = 30.0  # s: its expiry (a value no leader refreshes goes away)
WINDOW = 10.0  # s of settled counts a rate is measured over
READS_PER_PASS = 200  # tasks and queues read per pass, at most (the others: as last read)
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

    def reset(self) -> None:
        """A new term: write again at the next pass (rates measured so far stay true)."""
        self.at, self.written = -math.inf, None

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
        """Read this pass's turn of the tasks and queues to read (``READS_PER_PASS`` at
        most): their counts, and the rates measured from them. Whether any changed."""
        read = self.readable
        if len(read) > READS_PER_PASS:
            start = self.turn % len(read)
            read = (read[start:] + read[:start])[:READS_PER_PASS]
            self.turn = start + READS_PER_PASS
        if not read:
            return False
        pipe = self.r.pipeline(transaction=False)
        for row in read:
            tk = self.keys.task(row.id)
            pipe.hmget(tk.record, "total", "done", "dead")
            if row.queue:
                pipe.xlen(tk.stream)
                pipe.zcount(tk.scheduled, "-inf", time.time())
        replies = iter(self.tally.run(pipe))
        changed = False
        for row in read:
            counts = _work(row, replies)
            changed = changed or self.counts.get(row.id) != counts
            self.counts[row.id] = counts
            settled = counts[0]
            if settled is not None:
                nodes = len((mirror.members if row.queue else mirror.nodes).get(row.id, ()))
                rate = self.per_worker.get(row.id)
                self._measure(row.id, settled, nodes, now)
                changed = changed or self.per_worker.get(row.id) != rate
        return changed

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


def _work(row: TaskRow, replies: Any) -> tuple[int | None, int | None]:
    """(items settled, items left) from the reads of one task or queue (None: unknown)."""
    total, done, dead = (_int(v) for v in next(replies))
    settled = done + dead
    if row.queue:
        length, due = _int(next(replies)), _int(next(replies))
        return settled, length + due
    if total <= 0:
        return settled, None  # a step task, or no total yet
    return settled, max(0, total - settled)


def _int(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0
