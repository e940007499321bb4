"""Handlers the test workers run (allowed with ``--allow tests.handlers``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from typing import Any

import redis

from queueworks.context import SubtaskContext


def work_for(ctx: SubtaskContext, seconds: float, *, step: float) -> None:
    """Busy for ``seconds`` in small steps, stopping at a safe point if the set changes."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ctx.checkpoint()
        time.sleep(step)


def double(payload: dict[str, Any]) -> int:
    return int(payload["x"]) * 2


def double_slow(payload: dict[str, Any], ctx: SubtaskContext) -> dict[str, Any]:
    """Takes a little while, suspends at safe points, and says who ran it in which role."""
    work_for(ctx, float(payload.get("seconds", 0.005)), step=0.001)
    return {
        "y": int(payload["x"]) * 2,
        "rank": ctx.role.rank,
        "world": ctx.role.world_size,
        "epoch": ctx.role.epoch,
        "worker": ctx.worker_id,
        "attempt": ctx.attempt,
    }


def double_at_gate(payload: dict[str, Any], ctx: SubtaskContext) -> dict[str, Any]:
    """``double_slow``, but it waits (at safe points) until the Redis key ``payload["gate"]``
    exists: a test holds a task running, whatever the machine's load, until it opens the
    gate. Gives up after ``payload["within"]`` s (60 by default)."""
    r = _conn(os.environ["QUEUEWORKS_REDIS_URL"])
    deadline = time.monotonic() + float(payload.get("within", 60))
    while not r.exists(payload["gate"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {payload['gate']} still closed")
        work_for(ctx, 0.02, step=0.005)
    return double_slow({**payload, "seconds": 0}, ctx)


def flaky(payload: dict[str, Any], ctx: SubtaskContext) -> dict[str, int]:
    """Fails on attempts 1 and 2, succeeds on 3."""
    if ctx.attempt < 3:
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    return {"x": payload["x"], "attempt": ctx.attempt}


def flaky_logged(payload: dict[str, Any], ctx: SubtaskContext) -> int:
    """Logs "index|attempt" to a Redis list; fails while ``attempt <= fails``."""
    _conn(os.environ["QUEUEWORKS_REDIS_URL"]).rpush(payload["log"], f"{ctx.index}|{ctx.attempt}")
    if ctx.attempt <= int(payload.get("fails", 0)):
        raise RuntimeError(f"failure on attempt {ctx.attempt}")
    return ctx.index


def always_fails(payload: dict[str, Any]) -> None:
    raise ValueError(f"cannot handle {payload!r}")


def fail_odd(payload: dict[str, Any]) -> int:
    if payload["x"] % 2:
        raise ValueError("odd")
    return int(payload["x"])


def not_json(payload: dict[str, Any]) -> object:
    return object()


def record_order(payload: dict[str, Any], ctx: SubtaskContext) -> dict[str, Any]:
    """Appends (key, seq, worker, epoch, partition stream) to a Redis list for order checks."""
    url = os.environ["QUEUEWORKS_REDIS_URL"]
    r = _conn(url)
    r.rpush(
        payload["log"],
        f"{payload['key']}|{payload['seq']}|{ctx.worker_id}|{ctx.role.epoch}|{ctx.role.rank}"
        f"|{ctx.role.world_size}",
    )
    work_for(ctx, float(payload.get("seconds", 0.0)), step=0.001)
    return payload["seq"]


def exit_process(payload: dict[str, Any]) -> None:
    os._exit(3)


def hang(payload: dict[str, Any]) -> None:
    while True:
        time.sleep(1)


_CONNS: dict[str, redis.Redis] = {}


def _conn(url: str) -> redis.Redis:
    if url not in _CONNS:
        _CONNS[url] = redis.Redis.from_url(url)
    return _CONNS[url]


def tracked(payload: dict[str, Any], ctx: SubtaskContext) -> dict[str, Any]:
    """Logs "index|worker|attempt|epoch|rank|world|t_start" to a Redis list, then works for
    ``seconds`` (suspending at safe points)."""
    r = _conn(os.environ["QUEUEWORKS_REDIS_URL"])
    role = ctx.role
    r.rpush(
        payload["log"],
        f"{ctx.index}|{ctx.worker_id}|{ctx.attempt}|{role.epoch}|{role.rank}|{role.world_size}"
        f"|{time.time()!r}",
    )
    seconds = float(payload.get("seconds", 0.0))
    work_for(ctx, seconds, step=min(0.002, seconds))
    return {"y": int(payload["x"]) * 2, "rank": role.rank, "epoch": role.epoch}


def escape(payload: dict[str, Any]) -> int:
    """Raises the BaseException ``payload["raise"]`` names (SystemExit, KeyboardInterrupt,
    GeneratorExit), else doubles ``x``: a handler's own escape is its failure."""
    kind = payload.get("raise")
    if kind == "SystemExit":
        raise SystemExit(3)
    if kind == "KeyboardInterrupt":
        raise KeyboardInterrupt
    if kind == "GeneratorExit":
        raise GeneratorExit
    return int(payload["x"]) * 2


def slow_first(payload: dict[str, Any], ctx: SubtaskContext) -> int:
    """Logs its attempt to a Redis list; attempt 1 sleeps ``seconds`` without a safe point
    (only a cold stop gets it out), later attempts return at once."""
    _conn(os.environ["QUEUEWORKS_REDIS_URL"]).rpush(payload["log"], ctx.attempt)
    if ctx.attempt == 1:
        time.sleep(float(payload["seconds"]))
    return ctx.attempt


def square(payload: dict[str, Any]) -> int:
    return int(payload["x"]) ** 2


def job_echo(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """A queue job that says who ran it: its id, attempt and worker."""
    return {"x": payload["x"], "job": ctx.job_id, "attempt": ctx.attempt, "worker": ctx.worker_id}


def job_logged(payload: dict[str, Any], ctx: Any) -> int:
    """Logs "job|worker|attempt|t_start" to the Redis list ``payload["log"]``, works for
    ``seconds`` in small steps (stopping at safe points), returns 2x."""
    r = _conn(os.environ["QUEUEWORKS_REDIS_URL"])
    r.rpush(payload["log"], f"{ctx.job_id}|{ctx.worker_id}|{ctx.attempt}|{time.time()!r}")
    seconds = float(payload.get("seconds", 0.0))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ctx.checkpoint()
        time.sleep(min(0.002, seconds))
    return int(payload["x"]) * 2


def sleep_for(payload: dict[str, Any]) -> None:
    """Sleeps ``seconds`` in Python (10 ms at a time) with no safe point: only a timeout
    gets it out."""
    end = time.monotonic() + float(payload["seconds"])
    while time.monotonic() < end:
        time.sleep(0.01)


async def async_double(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """An async handler: waits ``seconds`` (stopping at safe points), says who ran it."""
    end = time.monotonic() + float(payload.get("seconds", 0.0))
    await ctx.checkpoint()
    while time.monotonic() < end:
        await asyncio.sleep(min(0.05, max(0.0, end - time.monotonic())))
        await ctx.checkpoint()
    return {"y": int(payload["x"]) * 2, "attempt": ctx.attempt, "worker": ctx.worker_id}


async def async_sleep(payload: dict[str, Any]) -> float:
    """An async job that only waits (I/O-bound work)."""
    await asyncio.sleep(float(payload["seconds"]))
    return float(payload["seconds"])


async def async_hang(payload: dict[str, Any]) -> None:
    """Never finishes by itself: only a timeout (a cancellation) ends it."""
    await asyncio.sleep(3600)


def sleepy_double(payload: dict[str, Any]) -> dict[str, Any]:
    """A plain handler that waits (for a thread pool): which thread ran it, and when."""
    started = time.time()
    time.sleep(float(payload.get("seconds", 0.0)))
    return {"y": int(payload["x"]) * 2, "thread": threading.get_ident(), "t": started}


async def async_stubborn(payload: dict[str, Any], ctx: Any) -> str:
    """Swallows every cancellation and runs ``seconds`` whatever happens; counts its runs
    per job (or subtask) in the Redis hash ``payload["runs"]``."""
    run = getattr(ctx, "job_id", None) or f"subtask {ctx.index}"
    _conn(os.environ["QUEUEWORKS_REDIS_URL"]).hincrby(payload["runs"], run, 1)
    end = time.monotonic() + float(payload["seconds"])
    while time.monotonic() < end:
        with contextlib.suppress(asyncio.CancelledError):  # an uncancellable coroutine
            await asyncio.sleep(min(0.05, max(0.0, end - time.monotonic())))
    return "stubborn"


async def async_counted(payload: dict[str, Any], ctx: Any) -> int:
    """Counts its runs per job in the Redis hash ``payload["runs"]``, waits ``seconds``."""
    _conn(os.environ["QUEUEWORKS_REDIS_URL"]).hincrby(payload["runs"], ctx.job_id, 1)
    await asyncio.sleep(float(payload["seconds"]))
    return int(payload["x"]) * 2


async def async_blocker(payload: dict[str, Any]) -> float:
    """Blocks the event loop: ``time.sleep`` inside an ``async def``."""
    time.sleep(float(payload["seconds"]))
    return float(payload["seconds"])


def _wait_gate(key: str, within: float = 60.0) -> None:
    r = _conn(os.environ["QUEUEWORKS_REDIS_URL"])
    deadline = time.monotonic() + within
    while not r.exists(key):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {key} still closed")
        time.sleep(0.01)


def progress_steps(payload: dict[str, Any], ctx: Any) -> int:
    """Reports progress ``i / (n + 1)`` ("step i") for i = 1..n, each time waiting until the
    Redis key ``{gate}:{i}`` exists; then 100 reports in a burst (0.900 .. 0.999,
    "finishing": coalesced, the last one written before the settle). Returns n."""
    n = int(payload["steps"])
    for i in range(1, n + 1):
        ctx.progress(i / (n + 1), f"step {i}")
        _wait_gate(f"{payload['gate']}:{i}")
    for k in range(100):
        ctx.progress(0.9 + k / 1000, "finishing")
    return n


async def async_progress_steps(payload: dict[str, Any], ctx: Any) -> int:
    """``progress_steps`` as a coroutine (it waits with ``asyncio.sleep``)."""
    n, r = int(payload["steps"]), _conn(os.environ["QUEUEWORKS_REDIS_URL"])
    for i in range(1, n + 1):
        ctx.progress(i / (n + 1), f"step {i}")
        deadline = time.monotonic() + 60
        while not r.exists(f"{payload['gate']}:{i}"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {payload['gate']}:{i} still closed")
            await asyncio.sleep(0.01)
    for k in range(100):
        ctx.progress(0.9 + k / 1000, "finishing")
    return n


def bad_progress(payload: dict[str, Any], ctx: Any) -> None:
    """Reports a progress out of range (``payload["fraction"]``): the handler's bug."""
    ctx.progress(payload["fraction"])
