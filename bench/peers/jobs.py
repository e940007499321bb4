"""The jobs every system runs: a no-op, a latency stamp, and a long hold for the kill test.

Standard library and redis-py only (imported inside every peer's venv). The marks go to the
Redis the system under test uses (``$BENCH_REDIS_URL``), under keys no peer uses:

- ``bench:lat``    latency samples in seconds (handler start minus the producer's send time);
- ``bench:starts`` one JSON record per start of a hold job: pid, pgid, ppid, wall time;
- ``bench:ready``  one entry per worker process that finished booting (where a peer has a hook);
- ``bench:runs``   how many times each counted job ran (job number -> runs), for the smoke test.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis

LAT_KEY = "bench:lat"
STARTS_KEY = "bench:starts"
READY_KEY = "bench:ready"
RUNS_KEY = "bench:runs"

_clients: dict[int, redis.Redis] = {}  # per pid: never share a socket across fork


def marks() -> redis.Redis:
    client = _clients.get(os.getpid())
    if client is None:
        client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"], socket_timeout=30)
        _clients.clear()
        _clients[os.getpid()] = client
    return client


def noop(*args: Any, **kwargs: Any) -> None:
    return None


async def anoop(*args: Any, **kwargs: Any) -> None:
    return None


async def acount(i: int) -> None:
    """A job that says it ran: ``bench:runs[i] += 1`` (a blocking call: for small runs)."""
    marks().hincrby(RUNS_KEY, str(i), 1)


def stamp(sent: float) -> None:
    now = time.time()  # before any connect: a first-use connection is not the queue's latency
    marks().rpush(LAT_KEY, repr(now - float(sent)))


def mark_ready(who: str) -> None:
    marks().rpush(READY_KEY, f"{who}:{os.getpid()}")


def record_start() -> None:
    record = {"pid": os.getpid(), "pgid": os.getpgid(0), "ppid": os.getppid(), "t": time.time()}
    marks().rpush(STARTS_KEY, json.dumps(record))


def hold(seconds: float) -> None:
    record_start()
    time.sleep(float(seconds))


# queueworks handlers take one JSON payload (and the context, to stop at a safe point).


def qw_stamp(payload: dict[str, Any]) -> None:
    stamp(payload["sent"])


async def qw_anoop(payload: Any) -> None:
    return None


async def qw_acount(payload: dict[str, Any]) -> None:
    await acount(payload["i"])


def qw_hold(payload: dict[str, Any], ctx: Any) -> None:
    record_start()
    end = time.monotonic() + float(payload["seconds"])
    while time.monotonic() < end:
        ctx.checkpoint()  # a node-set change suspends the step; it runs again afterwards
        time.sleep(0.05)
