"""The client side of asyncio, alone (no worker): what ``AsyncClient``'s enqueue and
``await job.result()`` cost, next to the sync client's and to the plain way of doing them.

    python -m bench.aclient                  # --n 5000 --waiters 1000 --seconds 3 --repeat 3

Enqueue: ``--n`` jobs one ``enqueue()`` at a time (sync ``Client``, then ``AsyncClient``),
and ``--n`` ``await q.enqueue()`` gathered at once (their round trips shared,
``JobWriter``), against the same gathered calls each sending its own Lua call.
Waiting: ``--waiters`` ``await job.result()`` on jobs that never finish, for ``--seconds``:
the client's CPU time and HMGETs per second, through ``ResultWatcher`` against each call
polling by itself (the sync schedule, awaited). One private Redis; each figure is the best
of ``--repeat`` runs (for waiting: the run with the least client CPU per look).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
import uuid
from typing import Any

from bench.common import private_redis
from queueworks import AsyncClient, Client
from queueworks.client.aio_queue_handle import AsyncJob, AsyncQueue
from queueworks.queue.queues import (
    FIRST_PAUSE,
    LAST_PAUSE,
    RESULT_FIELDS,
    finished,
    new_job,
    not_finished,
)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def sync_one_by_one(url: str, n: int) -> float:
    with Client.from_url(url, prefix=f"b{uuid.uuid4().hex[:6]}") as client:
        q = client.queue("q")
        t0 = time.perf_counter()
        for i in range(n):
            q.enqueue("m:f", {"i": i})
        return n / (time.perf_counter() - t0)


async def async_enqueue(url: str, n: int, how: str) -> float:
    async with AsyncClient.from_url(url, prefix=f"b{uuid.uuid4().hex[:6]}") as client:
        q = await client.queue("q")
        await q.enqueue("m:f", 0)  # the queue knows the handler: every way sends one call
        t0 = time.perf_counter()
        if how == "one by one":
            for i in range(n):
                await q.enqueue("m:f", {"i": i})
        elif how == "gathered":
            await asyncio.gather(*(q.enqueue("m:f", {"i": i}) for i in range(n)))
        else:  # gathered, each call its own Lua call (what JobWriter saves)
            await asyncio.gather(*(_own_call(q, i) for i in range(n)))
        return n / (time.perf_counter() - t0)


async def _own_call(q: AsyncQueue, i: int) -> None:
    job = new_job("m:f", {"i": i}, None, None)
    await q.client.scripts.enqueue_jobs(q.keys, [job], time.time())


async def _alone(job: AsyncJob, timeout: float) -> Any:
    """``Job.result``'s loop, awaited: each call polls by itself."""
    r = job.queue.client.redis
    deadline = time.monotonic() + timeout
    pause = FIRST_PAUSE
    while True:
        reply = await r.hmget(job.key, RESULT_FIELDS)
        done = finished(job.queue.name, job.id, reply)
        if done is not None:
            return done[0]
        if time.monotonic() >= deadline:
            raise not_finished(job.id, reply, timeout)
        await asyncio.sleep(pause)
        pause = min(LAST_PAUSE, pause * 1.5)


async def waiting(url: str, waiters: int, seconds: float, how: str) -> tuple[float, float]:
    """(CPU s per wall s, HMGETs per s) of ``waiters`` calls waiting ``seconds``."""
    async with AsyncClient.from_url(url, prefix=f"b{uuid.uuid4().hex[:6]}") as client:
        q = await client.queue("q")
        jobs = await q.enqueue_many(("m:f", i) for i in range(waiters))
        await client.redis.config_resetstat()
        cpu, t0 = _cpu(), time.perf_counter()
        calls = (j.result(seconds) if how == "watcher" else _alone(j, seconds) for j in jobs)
        await asyncio.gather(*calls, return_exceptions=True)
        wall = time.perf_counter() - t0
        stats: Any = await client.redis.info("commandstats")
        return (_cpu() - cpu) / wall, int(stats["cmdstat_hmget"]["calls"]) / wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--waiters", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rows: dict[str, list[float]] = {}
    waits: dict[str, list[tuple[float, float]]] = {"watcher": [], "alone": []}
    with private_redis() as server:
        for _ in range(args.repeat):
            rows.setdefault("Client, one by one", []).append(sync_one_by_one(server.url, args.n))
            for how in ("one by one", "gathered", "gathered, a Lua call each"):
                rate = asyncio.run(async_enqueue(server.url, args.n, how))
                rows.setdefault(f"AsyncClient, {how}", []).append(rate)
            for how in waits:
                run = asyncio.run(waiting(server.url, args.waiters, args.seconds, how))
                waits[how].append(run)
            server.client().flushall()
    print(f"enqueue, {args.n} jobs (jobs/s, best of {args.repeat})")
    for name, rates in rows.items():
        print(f"  {name:<38} {max(rates):>9,.0f}")
    print(f"{args.waiters} await job.result() waiting {args.seconds} s (best of {args.repeat})")
    for how, runs in waits.items():
        cpu, polls = min(runs, key=lambda run: run[0] / run[1])  # least CPU per look
        label = "ResultWatcher" if how == "watcher" else "each call polling alone"
        print(
            f"  {label:<24} {polls:>8,.0f} HMGET/s for {cpu:4.0%} of a core: "
            f"{cpu / polls * 1e6:5.1f} µs of client CPU per look"
        )


if __name__ == "__main__":
    main()
