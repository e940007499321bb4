"""Handlers of the retry-backoff tests (tests/test_retry.py): each logs its starts to a Redis
list, so a test reads when every attempt began."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

_CONNS: dict[str, redis.Redis] = {}


def _log(key: str, line: str) -> None:
    url = os.environ["QUEUEWORKS_REDIS_URL"]
    if url not in _CONNS:
        _CONNS[url] = redis.Redis.from_url(url)
    _CONNS[url].rpush(key, line)


def fails_first(payload: dict[str, Any], ctx: Any) -> int:
    """A queue job or a subtask: logs "name|attempt|t_start" to ``payload["log"]`` (name:
    ``payload["name"]``), fails while ``attempt <= payload["fails"]``, then returns the
    attempt it succeeded on."""
    _log(payload["log"], f"{payload['name']}|{ctx.attempt}|{time.time()!r}")
    if ctx.attempt <= int(payload.get("fails", 0)):
        raise RuntimeError(f"failure on attempt {ctx.attempt}")
    time.sleep(float(payload.get("seconds", 0.0)))
    return int(ctx.attempt)


def starts(r: redis.Redis, log: str) -> dict[str, list[tuple[int, float]]]:
    """The log of ``fails_first``: each name's (attempt, start time), in order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for raw in r.lrange(log, 0, -1):
        name, attempt, t = raw.decode().split("|")
        out.setdefault(name, []).append((int(attempt), float(t)))
    return out
