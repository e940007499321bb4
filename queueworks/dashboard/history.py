"""Settled and dead subtasks and jobs per minute, kept in Redis for a day
(``Keys.throughput_minutes``), so every dashboard process shows the same history and a
restart loses none of it.

The dashboard's throughput samples (``throughput``) already measure what settled between
two samples; ``Minutes`` adds each sample's growth to the minute the sample was taken in,
and once a minute is over writes it, with ``HSETNX``: only a process that watched the minute
whole writes it (one that started within it would undercount), and the first of several
dashboards to write a minute is the one kept. No per-job cost: nothing is written where
jobs settle. A minute no dashboard watched has no entry (``None``: unknown, not 0).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.transport.connection import Connection

MINUTE = 60
KEPT = 24 * 60  # minutes kept: a day
PRUNE_EVERY = 10  # minutes between prunes of those older than KEPT


class Minute(NamedTuple):
    at: float  # the minute's start (s since the epoch)
    settled: int | None  # subtasks and jobs settled (done or dead) in it; None: unknown
    dead: int | None  # of those, dead


class Minutes:
    """The minute being counted by this process, written to Redis when it ends."""

    def __init__(self) -> None:
        self.minute: int | None = None
        self.whole = False  # watched from its start
        self.settled = 0
        self.dead = 0

    def add(self, r: Connection, keys: Keys, at: float, settled: int, dead: int) -> None:
        """Count a sample taken at ``at`` (growth since the previous sample); a minute that
        ended is written first (``HSETNX``), if this process watched it whole."""
        minute = int(at // MINUTE)
        if self.minute is None:  # the first sample: this minute is not watched whole
            self.minute = minute
            return
        if minute != self.minute:
            if self.whole:
                write(r, keys, self.minute, self.settled, self.dead)
            self.minute, self.whole, self.settled, self.dead = minute, True, 0, 0
        self.settled += settled
        self.dead += dead


def write(r: Connection, keys: Keys, minute: int, settled: int, dead: int) -> None:
    """Record ``minute`` (the first writer's count is kept); every ``PRUNE_EVERY`` minutes,
    drop those older than ``KEPT``."""
    r.hsetnx(keys.throughput_minutes, str(minute), f"{settled} {dead}")
    if minute % PRUNE_EVERY == 0:
        old = [f for f in r.hkeys(keys.throughput_minutes) if _minute(f) < minute - KEPT]
        if old:
            r.hdel(keys.throughput_minutes, *old)


def _minute(field: Any) -> int:
    try:
        return int(text(field))
    except ValueError:
        return -1  # no minute: pruned


def read(r: Connection, keys: Keys, now: float, count: int = 60) -> list[Minute]:
    """The ``count`` minutes before the one of ``now``, oldest first: one HMGET."""
    last = int(now // MINUTE) - 1
    minutes = list(range(last - count + 1, last + 1))
    raw = r.hmget(keys.throughput_minutes, [str(m) for m in minutes]) if minutes else []
    return [_decoded(m, v) for m, v in zip(minutes, raw, strict=True)]


def _decoded(minute: int, raw: Any) -> Minute:
    try:
        settled, dead = (int(x) for x in text(raw).split())
    except (ValueError, TypeError, AttributeError):
        return Minute(minute * MINUTE, None, None)  # none written, or not readable
    return Minute(minute * MINUTE, max(0, settled), max(0, dead))
