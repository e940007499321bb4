"""``AsyncLine``: ``queueworks.transport.wire.Line`` on a ``redis.asyncio`` client's pool.

The same bytes (``queueworks.transport.wire.XaddBytes``) and the same errors. A kept connection is
checked before each use as the pool checks it (nothing buffered, not at EOF); one whose
call did not end with its reply read (an error of the connection, or the calling task
cancelled while it waited) is dropped, never used again out of step. One event loop's:
a connection kept under another loop (``asyncio.run`` again) is dropped, not used.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis
import redis.asyncio
from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis.exceptions import ReadOnlyError
from redis.utils import HIREDIS_AVAILABLE

from queueworks.transport.wire import Forks, kept


class AsyncLine:
    """Connections of one asyncio client's pool kept out of it for pre-built commands, at
    most ``kept(pool)`` between calls (the pool blocks a call that finds none free)."""

    def __init__(self, r: redis.asyncio.Redis) -> None:
        self.pool: Any = r.connection_pool
        self.sentinel = bool(getattr(self.pool, "is_master", False))
        self.idle: list[tuple[Any, Any]] = []  # (connection, its event loop)
        self.forks = Forks.count
        self.kept = kept(self.pool)

    @classmethod
    def of(cls, r: Any) -> AsyncLine | None:
        """A line for ``r``'s pool; None for a cluster, or connections not parsed by
        hiredis (RESP2)."""
        if type(r).__name__ == "BoundedCluster" or not isinstance(r, redis.asyncio.Redis):
            return None
        given = r.connection_pool.connection_kwargs
        if not HIREDIS_AVAILABLE or "parser_class" in given:
            return None
        if str(given.get("protocol") or 2) != "2":
            return None
        return cls(r)

    async def call(self, packed: bytes) -> Any:
        """Send one packed command and return its raw reply (``queueworks.transport.wire``)."""
        conn, loop = await self._take()
        try:
            conn._writer.write(packed)
            await conn._writer.drain()
            parser = conn._parser
            reader = parser._reader
            reply = reader.gets()
            while reply is NOT_ENOUGH_DATA:
                await parser.read_from_socket()
                reply = reader.gets()
        except BaseException:
            await self._drop(conn)
            raise
        if isinstance(reply, redis.ConnectionError):  # LOADING: as redis-py, drop it
            await self._drop(conn)
            raise reply
        if self.sentinel and isinstance(reply, ReadOnlyError):
            await self._drop(conn)
            raise redis.ConnectionError("The previous master is now a slave")
        if len(self.idle) < self.kept:
            self.idle.append((conn, loop))
        else:
            await self.pool.release(conn)
        if isinstance(reply, redis.ResponseError):
            raise reply
        return reply

    async def _take(self) -> tuple[Any, Any]:
        if self.forks != Forks.count:
            self.idle, self.forks = [], Forks.count
        loop = asyncio.get_running_loop()
        while self.idle:
            conn, kept_under = self.idle.pop()
            if kept_under is loop and conn.is_connected and not await conn._parser.can_read():
                return conn, loop
            if kept_under is loop:
                await self._drop(conn)
            else:  # its transport belongs to a loop that may be closed: forget it
                self._forget(conn)
        conn = await self.pool.get_connection()
        return conn, loop

    async def _drop(self, conn: Any) -> None:
        try:
            await conn.disconnect()
        finally:
            await self.pool.release(conn)

    def _forget(self, conn: Any) -> None:
        """A connection of another event loop: out of the pool's books, not awaited."""
        self.pool._in_use_connections.discard(conn)

    async def aclose(self) -> None:
        """Give the kept connections back to the pool."""
        idle, self.idle = self.idle, []
        if self.forks == Forks.count:
            for conn, _ in idle:
                await self.pool.release(conn)
