"""A worker pool's record: what ``queueworks worker --processes N`` (``workers.pool``) says
about itself, next to the records of its members (each a worker like any other).

``qw:pool:<P>`` holds the ``PoolRecord`` as JSON, with a TTL a few times the supervisor's
interval: a pool whose supervisor is gone disappears from every view by itself. ``qw:pools``
indexes them (score: the last write); readers skip an index entry whose record is gone.
This module is the record's one codec: the supervisor writes through ``write_pool``, and
``info``, ``health`` and the dashboard read through ``read_pools`` / ``read_pool``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.transport.connection import Connection

FORGET_AFTER = 3600.0  # s: index entries older than this are dropped by the next write


class PoolRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    host: str
    pid: int
    processes: int  # the members it keeps running
    members: list[str] = Field(default_factory=list)  # the worker ids running now
    restarts: int = 0  # members started again after one exited (any reason, retirements too)
    retired: int = 0  # of those, members that left on their own (exit 0: a per-child limit)
    failed: int = 0  # members that exited non-zero (a crash, a hung handler, a kill)
    backoff: float = 0.0  # s: the wait before the next start while members fail at start-up
    started_at: float
    updated_at: float


def write_pool(pipe: Any, keys: Keys, record: PoolRecord, ttl: float) -> None:
    """Put the write of ``record`` (kept ``ttl`` s) and its index entry on ``pipe``."""
    pipe.set(keys.pool(record.id), record.model_dump_json(), px=max(1, int(ttl * 1000)))
    pipe.zadd(keys.pools, {record.id: record.updated_at})
    pipe.zremrangebyscore(keys.pools, "-inf", record.updated_at - FORGET_AFTER)


def forget_pool(pipe: Any, keys: Keys, pool_id: str) -> None:
    """Put the removal of a pool that stopped on ``pipe``."""
    pipe.delete(keys.pool(pool_id))
    pipe.zrem(keys.pools, pool_id)


def parse_pool(raw: Any) -> PoolRecord | None:
    """A stored record, or None if absent or not one (a bad value is no pool, never a crash)."""
    if raw is None:
        return None
    try:
        return PoolRecord.model_validate_json(text(raw))
    except (ValidationError, ValueError):
        return None


def read_pool(r: Connection, keys: Keys, pool_id: str) -> PoolRecord | None:
    return parse_pool(r.get(keys.pool(pool_id)))


def read_pools(r: Connection, keys: Keys) -> list[PoolRecord]:
    """Every live pool, by id."""
    ids: Sequence[Any] = r.zrange(keys.pools, 0, -1)
    if not ids:
        return []
    pipe = r.pipeline(transaction=False)
    for pool_id in ids:
        pipe.get(keys.pool(text(pool_id)))
    found = (parse_pool(raw) for raw in pipe.execute())
    return sorted((p for p in found if p is not None), key=lambda p: p.id)
