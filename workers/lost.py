"""Finding dead workers, for their queues: liveness is per worker process, not per queue.

A queue's members keep no heartbeat of their own in it: the pool heartbeat
(``qw:worker:<W>:hb``, and ``qw:workers`` scored by the last beat) is their liveness. On each
of its ticks the heartbeat asks, on its own pipeline, for the workers whose last beat is older
than a TTL (``qw:workers`` by score, newest first: a few, whatever the number of queues or
workers alive); a candidate whose heartbeat key no longer EXISTS (EXISTS expires it on the
spot) is dead. So is a worker the controller found dead first and dropped from
``qw:workers`` (its entry in ``qw:workers:lost``, read from where the last look stopped; the
first look reads every entry the capped stream keeps, so a worker dropped just before this one
started, while still a member of a queue this one joins, is pruned too). Its
queues are the set it recorded before it read any of their jobs
(``qw:worker:<W>:queues``), taken whole in one MULTI (SMEMBERS + DEL): exactly one finder
gets them. The finder prunes the dead worker from each of them (``depart.lua``: a new epoch),
and each queue's leader, at that epoch, claims what it left pending and runs it again,
charged. A worker whose beat runs out before the next tick is looked at the moment it does.
So a dead worker's jobs, in every queue it read, are found within its TTL plus about one
round trip (one tick at worst), and no queue is ever scanned to find them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from queueworks.protocol import events
from queueworks.protocol.keys import GROUP, Keys
from queueworks.protocol.messages import text
from queueworks.scripts import calls
from queueworks.scripts.bound import Queued, Scripts
from queueworks.transport.connection import Connection
from queueworks.transport.lost_workers import KEPT as LOST_KEPT

LOOK = 16  # candidates looked at per tick (the most recent first)
PRUNE_BATCH = 500  # departures per pipeline
LOOK_COMMANDS = 2  # what ``look_on`` puts on the pipeline


class LostWorkers:
    def __init__(
        self, r: Connection, keys: Keys, scripts: Scripts, me: str, *, ttl: float, log: Any
    ) -> None:
        self.r, self.keys, self.scripts, self.me = r, keys, scripts, me
        self.ttl, self.log = ttl, log
        self.pruned = 0  # departures this worker wrote
        self.cursor: str | None = None  # the last ``qw:workers:lost`` entry read

    def look_on(
        self, pipe: Any, now: float, ahead: float
    ) -> Callable[[list[Any]], tuple[list[str], float | None]]:
        """Put on ``pipe`` the look for workers whose last beat is older than the TTL, or
        will be within ``ahead`` s. Returns what reads its reply: the candidates whose beat
        ran out (to ``confirm``), and when the next one runs out (None: none within
        ``ahead``)."""
        at = len(pipe)
        pipe.zrevrangebyscore(
            self.keys.workers, now - self.ttl + ahead, "-inf", start=0, num=LOOK, withscores=True
        )
        cursor = self.cursor
        if cursor is None:  # the first look: every entry kept (dead ones not yet pruned)
            pipe.xrange(self.keys.workers_lost, count=LOST_KEPT)
        else:
            pipe.xread({self.keys.workers_lost: cursor}, count=LOOK)

        def read(replies: list[Any]) -> tuple[list[str], float | None]:
            due: list[str] = []
            soon: float | None = None
            lost = replies[at + 1]
            entries = lost if cursor is None else (lost[0][1] if lost else [])
            if cursor is None:
                self.cursor = "0-0"
            for entry_id, fields in entries:
                self.cursor = text(entry_id)
                worker = text(fields.get(b"worker", b""))
                if worker and worker != self.me:
                    due.append(worker)  # (the controller dropped it: found dead)
            for raw, beat in replies[at]:
                worker = text(raw)
                if worker == self.me:
                    continue
                runs_out = float(beat) + self.ttl
                if runs_out <= now:
                    due.append(worker)
                elif soon is None or runs_out < soon:
                    soon = runs_out
            return due, soon

        return read

    def confirm(self, candidates: list[str]) -> int:
        """Of ``candidates`` (beat older than a TTL), the dead ones (heartbeat key gone)
        leave every queue they recorded; returns how many departures that took."""
        if not candidates:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for worker in candidates:
            pipe.exists(self.keys.worker_heartbeat(worker))
        alive = pipe.execute()
        return sum(
            self.queues_of_dead(w) for w, live in zip(candidates, alive, strict=True) if not live
        )

    def queues_of_dead(self, worker: str) -> int:
        """``worker`` is dead: take the queues it recorded (one finder gets them) and prune
        it from each; the others find nothing to do."""
        key = self.keys.worker_queues(worker)
        pipe = self.r.pipeline(transaction=True)
        pipe.smembers(key)
        pipe.delete(key)
        names = self._pending_first(worker, sorted(text(n) for n in pipe.execute()[0]))
        if not names:
            return 0
        departed = 0
        now = time.time()
        for k in range(0, len(names), PRUNE_BATCH):
            batch = names[k : k + PRUNE_BATCH]
            pipe = self.r.pipeline(transaction=False)
            queued = [
                Queued(
                    self.scripts,
                    # its heartbeat is gone: no need to ask the queue's (it keeps none)
                    calls.depart(self.keys.task(q), worker, now, "dead", only_if_dead=False),
                    pipe,
                )
                for q in batch
            ]
            replies = pipe.execute(raise_on_error=False)
            lost = [(q, c.reply(replies)) for q, c in zip(batch, queued, strict=True)]
            pipe = self.r.pipeline(transaction=False)
            for q, epoch in lost:
                if epoch:
                    departed += 1
                    events.emit(pipe, self.keys, "member_lost", task=q, worker=worker, epoch=epoch)
            pipe.execute()
        self.pruned += departed
        self.log.info("worker_lost", worker=worker, queues=len(names), pruned=departed)
        return departed

    def _pending_first(self, worker: str, names: list[str]) -> list[str]:
        """``names`` with the queues where ``worker`` left jobs pending first: they are
        pruned (and so re-ranked by their members, whose leader claims the jobs) before the
        queues it only served, however many those are. One pipeline of ``XPENDING``
        summaries, when there are more than a batch of queues."""
        if len(names) <= PRUNE_BATCH:
            return names
        pipe = self.r.pipeline(transaction=False)
        for q in names:
            pipe.xpending(self.keys.task(q).stream, GROUP)
        replies = pipe.execute(raise_on_error=False)
        mine = worker.encode()

        def holds(reply: Any) -> bool:
            if not isinstance(reply, dict):
                return False  # (no stream or group: nothing pending there)
            return any(c.get("name") in (mine, worker) for c in reply.get("consumers") or ())

        first = [q for q, reply in zip(names, replies, strict=True) if holds(reply)]
        seen = set(first)
        return first + [q for q in names if q not in seen]
