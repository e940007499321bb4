"""streaq: N worker processes (anyio, default concurrency 16 each, or ``$BENCH_CONCURRENCY``)
on Redis Streams; jobs enqueued with ``Worker.enqueue_many`` (one pipeline per batch). The
async workload (``enqueue_async``): one awaited ``task.enqueue(...)`` per job.

A worker process is ``python -m bench.peers.peer_streaq``: what ``streaq run`` does, with
logging at WARNING (streaq's CLI logs two INFO lines per task).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from streaq import Worker

from bench.peers import jobs
from bench.peers.harness import Peer, produce

BATCH = 1000
STREAM = "streaq:default:queues:normal"
T = TypeVar("T")


@asynccontextmanager
async def _lifespan() -> AsyncIterator[None]:
    jobs.mark_ready("streaq")
    yield None


worker: Worker[Any] = Worker(
    redis_url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
    lifespan=_lifespan,
    concurrency=int(os.environ.get("BENCH_CONCURRENCY", "16")),  # streaq's default: 16
)


@worker.task
async def noop(i: int) -> None:
    jobs.noop(i)


@worker.task
async def anoop(i: int) -> None:
    await jobs.anoop(i)


@worker.task
async def acount(i: int) -> None:
    await jobs.acount(i)


@worker.task
async def stamp(sent: float) -> None:
    jobs.stamp(sent)


@worker.task
async def hold(seconds: float) -> None:
    jobs.record_start()
    await asyncio.sleep(seconds)


class Driver(Peer):
    """The producer side keeps one initialised ``Worker`` open in a background event loop."""

    name = "streaq"

    def __init__(self, url: str, logdir: Path, variant: str | None = None) -> None:
        super().__init__(url, logdir, variant)
        self.loop = asyncio.new_event_loop()
        self._opened = threading.Event()
        self._closing: asyncio.Event | None = None
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._hold(),))
        self._thread.start()
        self._opened.wait(30)
        self.hold_id = ""

    async def _hold(self) -> None:
        self._closing = asyncio.Event()
        async with worker:
            self._opened.set()
            await self._closing.wait()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def start_workers(self, n: int, *, separate: bool) -> None:
        for i in range(n):
            self.spawn([sys.executable, "-m", "bench.peers.peer_streaq"], f"w{i}")

    def enqueue_noop(self, n: int) -> None:
        for start in range(0, n, BATCH):
            batch = [noop.enqueue(i) for i in range(start, min(n, start + BATCH))]
            self._run(worker.enqueue_many(batch))

    def enqueue_each(self, n: int) -> None:
        async def go() -> None:
            for i in range(n):
                await noop.enqueue(i)

        self._run(go())

    def enqueue_async(self, n: int, producers: int, deadline: float) -> int:
        task = acount if self.counting else anoop

        async def call(i: int) -> None:
            await task.enqueue(i)

        return self._run(produce(n, producers, deadline, call))

    def remaining(self) -> int:
        return int(self.r.xlen(STREAM))

    def enqueue_stamp(self, sent: float) -> None:
        async def go() -> None:
            await stamp.enqueue(sent)

        self._run(go())

    def enqueue_hold(self, seconds: float) -> None:
        async def go() -> str:
            return (await hold.enqueue(seconds)).id

        self.hold_id = self._run(go())

    def job_state(self) -> str:
        pending = self.r.xpending_range(STREAM, "workers", "-", "+", 10)
        if not pending:
            return f"no pending entry; {self.remaining()} entries in the stream"
        p = pending[0]
        return (
            f"entry pending on the dead consumer {p['consumer'].decode()} for"
            f" {p['time_since_delivered'] / 1000:.0f} s; reclaimed once idle for idle_timeout"
            f"={worker.idle_timeout / 1000:.0f} s, by a worker whose blocking read has returned"
        )

    def close(self) -> None:
        if self._closing is not None:
            self.loop.call_soon_threadsafe(self._closing.set)
        self._thread.join(30)
        self.loop.close()
        super().close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    worker.run_sync()
