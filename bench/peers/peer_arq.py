"""arq: N ``arq`` worker processes (asyncio, default ``max_jobs=10`` each, or
``$BENCH_CONCURRENCY``); jobs enqueued with ``enqueue_job``, which has no bulk form: calls
run concurrently, ``CONCURRENCY`` at a time. The async workload (``enqueue_async``): one
awaited ``enqueue_job`` per job."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

from bench.peers import jobs
from bench.peers.harness import Peer, produce

CONCURRENCY = 100
QUEUE = "arq:queue"
LOG_CONFIG = {  # arq's default config, at WARNING (its INFO logs a line per job)
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"arq.standard": {"level": "WARNING", "class": "logging.StreamHandler"}},
    "loggers": {"arq": {"handlers": ["arq.standard"], "level": "WARNING"}},
}


async def noop(ctx: dict[str, Any], i: int) -> None:
    jobs.noop(i)


async def anoop(ctx: dict[str, Any], i: int) -> None:
    await jobs.anoop(i)


async def acount(ctx: dict[str, Any], i: int) -> None:
    await jobs.acount(i)


async def stamp(ctx: dict[str, Any], sent: float) -> None:
    jobs.stamp(sent)


async def hold(ctx: dict[str, Any], seconds: float) -> None:
    jobs.record_start()
    await asyncio.sleep(seconds)


async def _startup(ctx: dict[str, Any]) -> None:
    jobs.mark_ready("arq")


def _settings() -> RedisSettings:
    return RedisSettings.from_dsn(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))


class WorkerSettings:
    functions = [noop, anoop, acount, stamp, hold]
    on_startup = _startup
    redis_settings = _settings()
    max_jobs = int(os.environ.get("BENCH_CONCURRENCY", "10"))  # arq's default: 10


class Driver(Peer):
    name = "arq"

    def __init__(self, url: str, logdir: Path, variant: str | None = None) -> None:
        super().__init__(url, logdir, variant)
        self.loop = asyncio.new_event_loop()
        self.pool: ArqRedis = self.loop.run_until_complete(create_pool(RedisSettings.from_dsn(url)))
        self.hold_id = ""

    def start_workers(self, n: int, *, separate: bool) -> None:
        exe = str(Path(sys.executable).with_name("arq"))
        log = ["--custom-log-dict", "bench.peers.peer_arq.LOG_CONFIG"]
        for i in range(n):
            self.spawn([exe, "bench.peers.peer_arq.WorkerSettings", *log], f"w{i}")

    def prepare(self) -> None:
        self.loop.run_until_complete(self.pool.ping())

    def enqueue_noop(self, n: int) -> None:
        async def go() -> None:
            for start in range(0, n, CONCURRENCY):
                batch = range(start, min(n, start + CONCURRENCY))
                await asyncio.gather(*(self.pool.enqueue_job("noop", i) for i in batch))

        self.loop.run_until_complete(go())

    def enqueue_each(self, n: int) -> None:
        async def go() -> None:
            for i in range(n):
                await self.pool.enqueue_job("noop", i)

        self.loop.run_until_complete(go())

    def enqueue_async(self, n: int, producers: int, deadline: float) -> int:
        name = "acount" if self.counting else "anoop"

        async def call(i: int) -> None:
            await self.pool.enqueue_job(name, i)

        return self.loop.run_until_complete(produce(n, producers, deadline, call))

    def remaining(self) -> int:
        return int(self.r.zcard(QUEUE))

    def enqueue_stamp(self, sent: float) -> None:
        self.loop.run_until_complete(self.pool.enqueue_job("stamp", sent))

    def enqueue_hold(self, seconds: float) -> None:
        job = self.loop.run_until_complete(self.pool.enqueue_job("hold", seconds))
        assert job is not None
        self.hold_id = job.job_id

    def job_state(self) -> str:
        ttl = int(self.r.pttl(f"arq:in-progress:{self.hold_id}"))
        queued = self.r.zscore(QUEUE, self.hold_id) is not None
        return (
            f"job {'still in ' + QUEUE if queued else 'not queued'}; its in-progress key expires"
            f" in {ttl / 1000:.0f} s (job_timeout 300 s + 10 s), then a worker may run it again"
        )

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()
        super().close()
