"""Handlers of the flow-control tests (tests/test_flow.py): each job notes in Redis when it
started and how many jobs of its group ran at that moment (its own start counted), so a
test reads the rate kept and the most of a group that ever ran at once."""

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


def noted(payload: dict[str, Any]) -> str:
    """Note the start (``<log>:starts``: "group|t"), count the group's running jobs up
    (``<log>:running``) and note how many ran (``<log>:peaks``: "group|n"), sleep
    ``seconds``, count down."""
    r, log, group = _conn(), payload["log"], str(payload.get("group", ""))
    pipe = r.pipeline()
    pipe.hincrby(f"{log}:running", group, 1)
    pipe.rpush(f"{log}:starts", f"{group}|{time.time()!r}")
    n = pipe.execute()[0]
    r.rpush(f"{log}:peaks", f"{group}|{n}")
    try:
        time.sleep(float(payload.get("seconds", 0.0)))
    finally:
        r.hincrby(f"{log}:running", group, -1)
    return group


def read_log(r: redis.Redis, log: str) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Each group's start times, and the most of it that ran at once."""
    starts: dict[str, list[float]] = {}
    for raw in r.lrange(f"{log}:starts", 0, -1):
        group, t = raw.decode().rsplit("|", 1)
        starts.setdefault(group, []).append(float(t))
    peaks: dict[str, int] = {}
    for raw in r.lrange(f"{log}:peaks", 0, -1):
        group, n = raw.decode().rsplit("|", 1)
        peaks[group] = max(peaks.get(group, 0), int(n))
    return starts, peaks


def hangs_first(payload: dict[str, Any], ctx: Any) -> int:
    """Note the start as ``noted`` does; the first attempt hangs (until its worker is
    killed), a later one returns its attempt."""
    r, log = _conn(), payload["log"]
    r.rpush(f"{log}:attempts", f"{ctx.attempt}|{ctx.worker_id}")
    if ctx.attempt == 1:
        time.sleep(120)
    return int(ctx.attempt)
