"""Handlers the shared-queues benchmark (``bench/shared_queues.py``) runs; its workers are
started with ``--allow bench.shared_jobs``.

- ``noop``: a queue job that does nothing (the throughput figures);
- ``nap``: a queue job that sleeps ``payload["seconds"]`` (the busy queues);
- ``subtask``: a batch task's subtask: it marks the first start of any subtask of its task
  (``SET payload["mark"] <wall time> NX`` on the worker's Redis), then works for
  ``payload["seconds"]``, stopping at safe points if its node set changes.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from queueworks.context import SubtaskContext

_clients: dict[int, redis.Redis] = {}  # per pid: never share a socket across fork


def _marks() -> redis.Redis:
    client = _clients.get(os.getpid())
    if client is None:
        client = redis.Redis.from_url(os.environ["QUEUEWORKS_REDIS_URL"], socket_timeout=30)
        _clients.clear()
        _clients[os.getpid()] = client
    return client


def noop(payload: Any) -> None:
    return None


def nap(payload: dict[str, Any]) -> None:
    time.sleep(float(payload["seconds"]))


def subtask(payload: dict[str, Any], ctx: SubtaskContext) -> None:
    _marks().set(payload["mark"], repr(time.time()), nx=True)
    end = time.monotonic() + float(payload["seconds"])
    while time.monotonic() < end:
        ctx.checkpoint()
        time.sleep(0.002)
