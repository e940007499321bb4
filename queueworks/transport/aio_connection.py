"""``redis.asyncio`` connections for ``AsyncClient``: the URLs and options of
``queueworks.transport.connection`` (one server, ``rediss://``, ``unix://``, a sentinel's primary, a
cluster), parsed by the same code.

The pool of a single server or a sentinel's primary holds at most ``max_connections``
(default 50) and makes a caller wait for a free connection instead of failing: a thousand
``await``s gathered at once queue for the pool, not for ``MaxConnectionsError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeAlias, TypeVar

import redis
import redis.asyncio
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import RedisClusterException

from queueworks.errors import BadUrl
from queueworks.transport.connection import (
    _URL_HELP,
    SOCKET_TIMEOUT,
    Target,
    client_options,
    parse_target,
    redact_url,
    sentinel_options,
    unreachable,
)

AsyncConnection: TypeAlias = "redis.asyncio.Redis | RedisCluster"

MAX_CONNECTIONS = 50  # per client (per node, in a cluster)
T = TypeVar("T")


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """A sentinel's primary, with the blocking pool's wait for a free connection."""


# Set while a task runs a command of a BoundedCluster: what that command runs inside it (a
# pipeline's redirected commands) takes no second place, so it cannot wait for itself.
_IN_FLIGHT: ContextVar[bool] = ContextVar("queueworks_cluster_in_flight", default=False)


class BoundedCluster(RedisCluster):
    """redis-py's asyncio cluster client fails a command whose node has ``max_connections``
    in use (``MaxConnectionsError``); this one makes it wait instead, as the blocking pool
    of a single server does: at most ``max_connections`` commands and pipelines are in
    flight at once (each holds at most one connection per node)."""

    def __init__(self, *, seeds: str, max_connections: int, **kwargs: Any) -> None:
        super().__init__(max_connections=max_connections, **kwargs)
        self.seeds = seeds
        self.in_flight = asyncio.Semaphore(max_connections)

    async def initialize(self, *args: Any, **kwargs: Any) -> RedisCluster:
        """Learn the topology (at the first command); as for the sync client, no seed
        node answering is a ``ConnectionError`` that says so."""
        try:
            await super().initialize(*args, **kwargs)
        except RedisClusterException as exc:  # not a RedisError: say what it is
            raise redis.ConnectionError(
                f"no seed node of the cluster answered ({self.seeds}): {exc}"
            ) from None
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        return await bounded(self.in_flight, super().execute_command, *args, **kwargs)

    def pipeline(
        self, transaction: Any | None = None, shard_hint: Any | None = None
    ) -> ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # redis-py's error
        return _BoundedPipeline(self, transaction)  # type: ignore[abstract]  # as redis-py's


class _BoundedPipeline(ClusterPipeline):
    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        client = self.cluster_client
        assert isinstance(client, BoundedCluster)
        run = super().execute
        return await bounded(client.in_flight, run, raise_on_error, allow_redirections)


async def bounded(
    slots: asyncio.Semaphore, run: Callable[..., Awaitable[T]], *a: Any, **kw: Any
) -> T:
    """``await run(...)`` holding one of ``slots`` (unless this task holds one already)."""
    if _IN_FLIGHT.get():
        return await run(*a, **kw)
    async with slots:
        token = _IN_FLIGHT.set(True)
        try:
            return await run(*a, **kw)
        finally:
            _IN_FLIGHT.reset(token)


def connect_async(
    url: str,
    *,
    ssl_ca_certs: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    socket_timeout: float = SOCKET_TIMEOUT,
    max_connections: int | None = None,
) -> AsyncConnection:
    """A ``redis.asyncio`` client for ``url``; no I/O until its first command. As for
    ``queueworks.transport.connection.connect``, commands are never retried silently."""
    kwargs = client_options(
        url,
        ssl_ca_certs,
        ssl_certfile,
        ssl_keyfile,
        socket_timeout,
        max_connections or MAX_CONNECTIONS,
    )
    try:
        target = parse_target(url)
        if target.kind == "cluster":
            return _cluster(target, kwargs)
        if target.kind == "sentinel":
            return _sentinel(target, kwargs)
        pool = BlockingConnectionPool.from_url(url, timeout=None, retry=_no_retry(), **kwargs)
        pool.connection_class = reaching(pool.connection_class, redact_url(url))
        return redis.asyncio.Redis.from_pool(pool)
    except BadUrl as exc:
        raise ValueError(f"{_URL_HELP} ({exc})") from None
    except ValueError:
        # redis-py's message may quote part of the URL, password included
        raise ValueError(_URL_HELP) from None


def reaching(base: type[Any], where: str) -> type[Any]:
    """``queueworks.transport.connection.reaching`` for a ``redis.asyncio`` connection class."""

    class Reaching(base):  # type: ignore[misc]
        async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
            if self.is_connected:
                return
            try:
                await super().connect_check_health(*args, **kwargs)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise unreachable(where, exc) from None

    Reaching.__name__ = Reaching.__qualname__ = base.__name__
    return Reaching


def _no_retry() -> Retry:
    return Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 0)


def _cluster(target: Target, kwargs: dict[str, Any]) -> RedisCluster:
    """The cluster client learns its topology at its first command."""
    nodes = [ClusterNode(h, p) for h, p in target.hosts]
    seeds = ",".join(f"{h}:{p}" for h, p in target.hosts)
    return BoundedCluster(
        seeds=seeds, startup_nodes=nodes, retry=_no_retry(), **target.options, **kwargs
    )


def _sentinel(target: Target, kwargs: dict[str, Any]) -> redis.asyncio.Redis:
    sentinel_kwargs = sentinel_options(target, kwargs)
    sentinel_kwargs["retry"] = _no_retry()
    sentinels = Sentinel(list(target.hosts), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call, unused-ignore]
    client: redis.asyncio.Redis = sentinels.master_for(
        target.service,
        connection_pool_class=_BlockingSentinelPool,
        timeout=None,
        retry=_no_retry(),
        **target.options,
        **kwargs,
    )
    return client
