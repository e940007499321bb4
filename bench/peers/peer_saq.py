"""saq: N worker processes, each saq's own command, ``saq bench.peers.peer_saq.settings``:
one ``Worker`` on a ``RedisQueue``, default ``concurrency=10`` (or ``$BENCH_CONCURRENCY``),
that many coroutines each waiting in ``BLMOVE`` for a job. A job is ``await
queue.enqueue("anoop", i=i)``: one Lua call (its key, the incomplete set, the queued list).
saq's job defaults are kept (timeout 10 s, retries 1, result kept 600 s).

Run only in the asyncio workload (``bench.asyncpeers``): saq has no sync client.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from saq import Queue

from bench.peers import jobs
from bench.peers.harness import Peer, produce

INCOMPLETE = "saq:default:incomplete"  # a job's id is here from enqueue until it finishes
BATCH = 100


async def anoop(ctx: dict[str, Any], *, i: int) -> None:
    await jobs.anoop(i)


async def acount(ctx: dict[str, Any], *, i: int) -> None:
    await jobs.acount(i)


async def _startup(ctx: dict[str, Any]) -> None:
    jobs.mark_ready("saq")


def settings() -> dict[str, Any]:
    """What ``saq bench.peers.peer_saq.settings`` starts a worker with."""
    return {
        "queue": Queue.from_url(os.environ["BENCH_REDIS_URL"]),
        "functions": [anoop, acount],
        "concurrency": int(os.environ.get("BENCH_CONCURRENCY", "10")),  # saq's default: 10
        "startup": _startup,
    }


class Driver(Peer):
    name = "saq"

    def __init__(self, url: str, logdir: Path, variant: str | None = None) -> None:
        super().__init__(url, logdir, variant)
        self.loop = asyncio.new_event_loop()
        self.queue = Queue.from_url(url)
        self.loop.run_until_complete(self.queue.connect())

    def start_workers(self, n: int, *, separate: bool) -> None:
        exe = str(Path(sys.executable).with_name("saq"))
        for i in range(n):
            self.spawn([exe, "bench.peers.peer_saq.settings"], f"w{i}")

    def enqueue_noop(self, n: int) -> None:
        async def go() -> None:
            for start in range(0, n, BATCH):
                batch = range(start, min(n, start + BATCH))
                await asyncio.gather(*(self.queue.enqueue("anoop", i=i) for i in batch))

        self.loop.run_until_complete(go())

    def enqueue_async(self, n: int, producers: int, deadline: float) -> int:
        name = "acount" if self.counting else "anoop"

        async def call(i: int) -> None:
            await self.queue.enqueue(name, i=i)

        return self.loop.run_until_complete(produce(n, producers, deadline, call))

    def remaining(self) -> int:
        return int(self.r.zcard(INCOMPLETE))

    def close(self) -> None:
        self.loop.run_until_complete(self.queue.disconnect())
        self.loop.close()
        super().close()
