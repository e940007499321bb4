"""Handlers of the priority tests: each start is logged to a Redis list, in order."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

_CONNS: dict[str, redis.Redis] = {}


def _conn() -> redis.Redis:
    url = os.environ["QUEUEWORKS_REDIS_URL"]
    if url not in _CONNS:
        _CONNS[url] = redis.Redis.from_url(url)
    return _CONNS[url]


def log_start(payload: dict[str, Any], ctx: Any) -> str:
    """Appends ``tag`` to the list ``log`` as the job starts, then sleeps ``seconds``;
    fails its first ``fail`` attempts, and while the key ``fail_while`` exists."""
    r = _conn()
    r.rpush(payload["log"], payload["tag"])
    time.sleep(float(payload.get("seconds", 0.0)))
    if ctx.attempt <= int(payload.get("fail", 0)):
        raise RuntimeError(f"attempt {ctx.attempt} fails")
    if payload.get("fail_while") and r.exists(payload["fail_while"]):
        raise RuntimeError(f"{payload['fail_while']} is set")
    return str(payload["tag"])
