"""The raw limit of a job on a Redis stream: the producer sends one ``XADD`` per job (one
round trip), N plain consumer processes wait blocked in ``XREADGROUP BLOCK`` and settle what
they read (``XACK`` + ``XDEL`` + a done counter) pipelined with their next read. No job
record, no handler lookup, no result, no retry, no membership: what any queue on one stream
costs at least, measured with the same harness as the queues.

A consumer process is ``python -m bench.peers.peer_raw NAME``. Standard library and redis-py
only.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import redis
import redis.asyncio

from bench.peers import jobs
from bench.peers.harness import Peer, produce

STREAM = "raw:jobs"
GROUP = "raw"
DONE = "raw:done"
COUNT = 100  # entries per read
BLOCK_MS = 100


class Driver(Peer):
    name = "raw"

    def __init__(self, url: str, logdir: Path, variant: str | None = None) -> None:
        super().__init__(url, logdir, variant)
        self.expected = 0

    def start_workers(self, n: int, *, separate: bool) -> None:
        try:
            self.r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        for i in range(n):
            self.spawn([sys.executable, "-m", "bench.peers.peer_raw", f"c{i}"], f"c{i}")

    def enqueue_noop(self, n: int) -> None:
        pipe = self.r.pipeline(transaction=False)
        for i in range(n):
            pipe.xadd(STREAM, {"i": i})
        pipe.execute()
        self.expected += n

    def enqueue_each(self, n: int) -> None:
        xadd = self.r.xadd
        for i in range(n):
            xadd(STREAM, {"i": i})
        self.expected += n

    def enqueue_async(self, n: int, producers: int, deadline: float) -> int:
        """One awaited ``XADD`` per job (redis-py's asyncio client); the consumers stay the
        plain ones (their reads are not the producer's limit)."""

        mark = {"c": 1} if self.counting else {}  # the consumer counts its runs (jobs.acount)

        async def go() -> int:
            r = redis.asyncio.Redis.from_url(self.url)
            try:
                return await produce(
                    n, producers, deadline, lambda i: r.xadd(STREAM, {"i": i, **mark})
                )
            finally:
                await r.aclose()

        sent = asyncio.run(go())
        self.expected += sent
        return sent

    def remaining(self) -> int:
        return self.expected - int(self.r.get(DONE) or 0)

    def enqueue_stamp(self, sent: float) -> None:
        self.r.xadd(STREAM, {"s": repr(sent)})
        self.expected += 1


def consume(url: str, name: str) -> None:
    r = redis.Redis.from_url(url)
    jobs.mark_ready("raw")
    read: list[bytes] = []
    while True:
        pipe = r.pipeline(transaction=False)
        if read:
            pipe.xack(STREAM, GROUP, *read)
            pipe.xdel(STREAM, *read)
            pipe.incrby(DONE, len(read))
        pipe.xreadgroup(GROUP, name, {STREAM: ">"}, count=COUNT, block=BLOCK_MS)
        reply = pipe.execute()[-1]
        read = []
        for entry_id, fields in reply[0][1] if reply else ():
            sent = fields.get(b"s")
            if sent is not None:
                jobs.stamp(float(sent))
            elif b"c" in fields:
                jobs.marks().hincrby(jobs.RUNS_KEY, fields[b"i"].decode(), 1)
            else:
                jobs.noop(fields)
            read.append(entry_id)


if __name__ == "__main__":
    consume(os.environ["BENCH_REDIS_URL"], sys.argv[1])
