"""The backstop of a pass: what no event announces.

- **Lost workers.** A worker that dies emits nothing; its heartbeat score in ``qw:workers``
  stops moving. Once a second, the workers whose score is older than the heartbeat TTL
  (``SUSPECTS`` at most) are read again, each at most once a second: those whose heartbeat
  key is gone are lost. The score is the worker's clock, the TTL Redis's: a worker whose
  clock runs ahead is found by the sweep instead, or by its members (``member_lost``).
- **The sweep.** Every active task and known worker is read again in turn, a page of
  ``SWEEP_PAGE`` ids a second: its cost is level however many tasks, queues and workers
  there are, and a missed event costs at most a round, ids / 50 s (60 s at 3,000, 200 s
  at 10,000). ``full_pass_interval`` (0: none) bounds a round instead: the page is then
  ceil(ids / interval), at least ``SWEEP_PAGE``, and grows with the ids.
- **Expired index entries.** Finished tasks leave the index ``qw:tasks`` once their keys
  have expired (``qw:tasks:expiry`` says when), ``EXPIRED`` a second at most.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.transport.connection import Connection

from .mirror import Mirror
from .reads import WorkerRead, all_ids, read_workers
from .tally import Tally
from .writes import Writes

SUSPECTS = 1000  # workers checked for a lost heartbeat per look
EVERY = 1.0  # s between two looks for suspects, sweep pages, expired index entries
EXPIRED = 200  # expired index entries handled per look
SWEEP_PAGE = 50  # ids the sweep reads per look (at least, with a full_pass_interval)


class Backstop:
    def __init__(
        self, r: Connection, keys: Keys, tally: Tally, *, heartbeat_ttl: float, interval: float
    ) -> None:
        self.r, self.keys, self.tally = r, keys, tally
        self.ttl, self.interval = heartbeat_ttl, interval
        self.looked = 0.0  # monotonic: the last look
        self._checked: dict[str, float] = {}  # suspect -> monotonic of its last check
        self._sweep: list[str] = []  # "t:<id>" / "w:<id>" still to read this round
        self._page = 0

    def due(self) -> bool:
        return time.monotonic() - self.looked >= EVERY

    def reset(self) -> None:
        self._sweep = []

    def queue_looks(self, pipe: Any) -> None:
        """Put the reads of the suspects and of the expired index entries on ``pipe``."""
        now = time.time()
        pipe.zrangebyscore(self.keys.workers, "-inf", now - self.ttl, 0, SUSPECTS)
        pipe.zrangebyscore(self.keys.tasks_expiry, "-inf", now, 0, EXPIRED)

    def suspects(self, raw: Sequence[Any], reading: set[str]) -> list[WorkerRead]:
        """Read the workers whose last heartbeat is older than the TTL (not checked in the
        last second): the ones whose heartbeat key is gone are lost."""
        now = time.monotonic()
        ids = [text(w) for w in raw if text(w) not in reading]
        ids = [w for w in ids if now - self._checked.get(w, -math.inf) >= EVERY]
        for wid in ids:
            self._checked[wid] = now
        if len(self._checked) > 4 * SUSPECTS:
            self._checked = {w: t for w, t in self._checked.items() if now - t < EVERY}
        return read_workers(self.r, self.keys, ids, tally=self.tally) if ids else []

    def sweep(self, mirror: Mirror, tasks: set[str], workers: set[str], deep: set[str]) -> set[str]:
        """Add the next page of the backstop sweep to what this pass reads."""
        if not self._sweep:
            task_ids, worker_ids = all_ids(self.r, self.keys, tally=self.tally)
            ids = {f"t:{t}" for t in {*task_ids, *mirror.tasks}}
            ids |= {f"w:{w}" for w in {*worker_ids, *mirror.workers}}
            self._sweep = sorted(ids, reverse=True)
            self._page = SWEEP_PAGE
            if self.interval > 0:
                rounds = max(1.0, self.interval / EVERY)
                self._page = max(SWEEP_PAGE, math.ceil(len(self._sweep) / rounds))
        page = set(self._sweep[-self._page :])
        del self._sweep[-self._page :]
        for item in page:
            kind, _, ident = item.partition(":")
            if kind == "t":
                tasks.add(ident)
                deep.add(ident)
            else:
                workers.add(ident)
        return page

    def expired(self, ids: list[str], writes: Writes) -> None:
        """Index entries whose keys should have expired by now: drop them, or look later."""
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.pttl(self.keys.task(tid).record)
        now = time.time()
        for tid, pttl in zip(ids, self.tally.run(pipe), strict=True):
            if pttl == -2:  # gone
                writes.forget_expired(tid, True, None)
            elif pttl == -1:  # persistent again: reopened (a requeued dead letter)
                writes.forget_expired(tid, False, None)
            else:
                writes.forget_expired(tid, False, now + pttl / 1000)
