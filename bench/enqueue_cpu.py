"""The producer alone: CPU per call of one job's enqueue, beside redis-py's ``xadd`` and a
bare-RESP ``XADD``, in one process pinned to one core with its redis-server.

    python -m bench.enqueue_cpu                 # 20,000 calls each, 5 rounds (~15 s)

Each round runs, in turn (the order reversed every other round), ``--n`` calls of: the sync
``q.enqueue(noop, i)``; the same of a typed job function, ``q.enqueue(typed_noop.call(i))``
(one ``int`` argument, checked and encoded by the call); ``await q.enqueue(noop, i)`` and
``await q.enqueue(typed_noop.call(i))`` one at a time (``AsyncClient``);
redis-py's ``r.xadd`` of the same fields; and an ``XADD`` written in RESP by hand on a bare
socket (``bench.resp_floor``), each call returning before the next. No workers: the jobs
stay queued. The figure is the process's CPU time per call (``time.process_time``),
median over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from bench.resp_floor import xadd_head
from queueworks import AsyncClient, Client
from queueworks.contrib.redis_server import RedisServer
from queueworks.examples import typed_noop

NOOP = "queueworks.examples:noop"


def per_call(n: int, call: Callable[[int], object]) -> float:
    """µs of this process's CPU per ``call(i)``, over ``n`` calls."""
    t0 = time.process_time()
    for i in range(n):
        call(i)
    return (time.process_time() - t0) / n * 1e6


def async_per_call(url: str, n: int, typed: bool = False) -> float:
    async def go() -> float:
        client = AsyncClient.from_url(url, prefix="qwa")
        try:
            q = await client.queue("cpu")
            await q.enqueue(NOOP, 0)  # the queue learns the handler
            await q.enqueue(typed_noop.call(0))
            t0 = time.process_time()
            if typed:
                for i in range(n):
                    await q.enqueue(typed_noop.call(i))
            else:
                for i in range(n):
                    await q.enqueue(NOOP, i)
            return (time.process_time() - t0) / n * 1e6
        finally:
            await client.close()

    return asyncio.run(go())


def bare(url: str) -> Callable[[int], object]:
    where = urlsplit(url)
    sock = socket.create_connection((where.hostname, where.port or 6379))
    head = xadd_head()

    def call(i: int) -> bytes:
        payload = b"%d" % i
        sock.sendall(head + b"$%d\r\n%s\r\n" % (len(payload), payload))
        return sock.recv(64)

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    subprocess.run(["taskset", "-pc", "0", str(os.getpid())], capture_output=True)
    with RedisServer() as server:
        subprocess.run(["taskset", "-pc", "0", str(server.pid)], capture_output=True)
        client = Client.from_url(server.url, prefix="qw")
        q = client.queue("cpu")
        q.enqueue(NOOP, 0)  # the queue learns the handlers
        q.enqueue(typed_noop.call(0))
        fields = {"h": NOOP, "p": "0"}
        ways: dict[str, Callable[[], float]] = {
            "`q.enqueue`": lambda: per_call(args.n, lambda i: q.enqueue(NOOP, i)),
            "`q.enqueue`, typed (`fn.call(i)`)": lambda: per_call(
                args.n, lambda i: q.enqueue(typed_noop.call(i))
            ),
            "`await q.enqueue` (asyncio)": lambda: async_per_call(server.url, args.n),
            "`await q.enqueue`, typed": lambda: async_per_call(server.url, args.n, True),
            "redis-py `xadd`": lambda: per_call(
                args.n, lambda i: client.redis.xadd("plain", fields)
            ),
            "bare RESP `XADD`": lambda: per_call(args.n, bare(server.url)),
        }
        runs: dict[str, list[float]] = {name: [] for name in ways}
        for k in range(args.rounds):
            for name in list(ways) if k % 2 == 0 else list(reversed(ways)):
                runs[name].append(ways[name]())
                server.client().delete("plain", "floor:jobs")
    print(f"µs of CPU per call, {args.n} calls, median of {args.rounds} rounds, one core\n")
    print("| call | µs per call | min to max |")
    print("| --- | ---: | ---: |")
    for name, values in runs.items():
        print(
            f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} to {max(values):.1f} |"
        )


if __name__ == "__main__":
    main()
