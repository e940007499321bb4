"""Handlers of the frozen-worker tests (tests/test_zombie.py): each notes in Redis, every
``TICK`` s while it runs, which job it is, the process running it and when
(``<log>``: "job|pid|kind|t", kind ``start``, ``tick`` or ``end``), so a test sees when a
handler ran, and whether it ran on after its worker was fenced. A run lasts ``ticks`` ticks
of its own (time frozen in SIGSTOP does not count)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis

TICK = 0.05

_CONNS: dict[str, redis.Redis] = {}


def _note(payload: dict[str, Any], kind: str) -> None:
    url = os.environ["QUEUEWORKS_REDIS_URL"]
    if url not in _CONNS:
        _CONNS[url] = redis.Redis.from_url(url)
    line = f"{payload['name']}|{os.getpid()}|{kind}|{time.time()!r}"
    _CONNS[url].rpush(payload["log"], line)


async def ticking_async(payload: dict[str, Any]) -> str:
    """An ``async def`` handler that never calls ``checkpoint``."""
    _note(payload, "start")
    for _ in range(int(payload["ticks"])):
        await asyncio.sleep(TICK)
        _note(payload, "tick")
    _note(payload, "end")
    return str(payload["name"])


def ticking_checked(payload: dict[str, Any], ctx: Any) -> str:
    """A plain handler that calls ``ctx.checkpoint()`` every tick, inside the broad
    ``except Exception`` a step's errors often get."""
    _note(payload, "start")
    for _ in range(int(payload["ticks"])):
        time.sleep(TICK)
        try:
            _note(payload, "tick")
            ctx.checkpoint()
        except Exception:  # (a handler that shrugs off its steps' errors)
            continue
    _note(payload, "end")
    return str(payload["name"])


def ticking_plain(payload: dict[str, Any]) -> str:
    """A plain handler that takes no context: it cannot be asked to stop."""
    _note(payload, "start")
    for _ in range(int(payload["ticks"])):
        time.sleep(TICK)
        _note(payload, "tick")
    _note(payload, "end")
    return str(payload["name"])


def runs(r: redis.Redis, log: str) -> dict[tuple[str, int], tuple[float, float]]:
    """Each run (job name, pid): when it started and when it last noted anything."""
    out: dict[tuple[str, int], tuple[float, float]] = {}
    for raw in r.lrange(log, 0, -1):
        name, pid, _, t = raw.decode().split("|")
        key, at = (name, int(pid)), float(t)
        first, last = out.get(key, (at, at))
        out[key] = (min(first, at), max(last, at))
    return out
