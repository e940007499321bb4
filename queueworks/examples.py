"""Example handlers used by ``queueworks demo`` and the compose file's workers.

Run workers with ``--allow queueworks.examples`` to let them import these.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from queueworks.context import JobContext, SubtaskContext
from queueworks.job_functions import job


def double(payload: dict[str, Any]) -> int:
    """The smallest useful handler: ``{"x": 3} -> 6``."""
    return int(payload["x"]) * 2


def noop(payload: Any) -> None:
    return None


@job
def typed_noop(n: int) -> None:
    """A typed no-op job of one ``int`` argument (``bench.job_cpu --typed``)."""


@job
def add(a: int, b: int, *, note: str = "") -> int:
    """A typed job function: ``q.enqueue(add.call(2, 3)).result()`` is 5."""
    return a + b


@job
async def add_later(a: int, b: int, *, ctx: JobContext | None = None) -> int:
    """``add`` as an ``async def`` (on a worker's event loop), which shows its context:
    ``a + b``, plus ``1000 * ctx.attempt`` when a worker runs it."""
    await asyncio.sleep(0)
    return a + b if ctx is None else a + b + 1000 * ctx.attempt


def digest(payload: dict[str, Any], ctx: SubtaskContext) -> dict[str, Any]:
    """A little CPU work per subtask (hash rounds), reporting which rank did it."""
    data = str(payload["x"]).encode()
    for _ in range(int(payload.get("rounds", 200))):
        data = hashlib.sha256(data).digest()
    return {"x": payload["x"], "digest": data.hex()[:16], "rank": ctx.role.rank}


def sleep(payload: dict[str, Any], ctx: SubtaskContext) -> float:
    """Sleep in small steps, suspending at a safe point if the node set changes."""
    seconds = float(payload.get("seconds", 0.1))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ctx.checkpoint()
        time.sleep(min(0.01, seconds))
    return seconds


def greet(payload: dict[str, Any]) -> str:
    """A queue's job: ``{"name": "Ada"} -> "hello Ada"``."""
    return f"hello {payload['name']}"


async def wait(payload: dict[str, Any]) -> float:
    """An I/O-bound job, as an ``async def`` handler: waits ``seconds`` (an HTTP call, say);
    with ``--concurrency N`` a worker waits on N of them at once."""
    seconds = float(payload.get("seconds", 0.5))
    await asyncio.sleep(seconds)
    return seconds


def count_to(payload: dict[str, Any], ctx: JobContext) -> int:
    """A queue's long job that says how far it is: ``n`` steps of ``seconds`` each, with a
    progress report after each (``{"n": 50} -> 50``)."""
    n = int(payload["n"])
    for i in range(n):
        time.sleep(float(payload.get("seconds", 0.01)))  # the work of one step
        ctx.progress((i + 1) / n, f"{i + 1} of {n}")
    return n
