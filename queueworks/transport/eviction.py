"""Redis must not evict: any ``maxmemory-policy`` but ``noeviction`` can drop a queue's
keys, its members' heartbeats or its results without a word.

The policy is read with ``CONFIG GET maxmemory-policy``, else (CONFIG refused: an ACL, a
managed Redis that renames it) from ``INFO memory``; on a Redis Cluster, from every
primary. What each part does with it:

* the worker and the controller refuse to start on an evicting Redis (one line naming the
  policy), unless told otherwise (``--allow-eviction``, ``QUEUEWORKS_ALLOW_EVICTION=1``);
  running, they read it again now and then and say so when it changes (``redis_evicting``);
* the client raises ``EvictingRedis`` on its first write (checked once per client),
  unless it was made with ``allow_eviction=True``;
* where the policy cannot be read at all, one warning (``redis_policy_unknown``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import redis
from redis.cluster import RedisCluster

from queueworks.errors import (
    NOEVICTION,
    EvictingRedis,
)
from queueworks.transport.connection import UNAVAILABLE, Connection

POLICY = "maxmemory-policy"
PROCESS_OVERRIDE = "start it with --allow-eviction (QUEUEWORKS_ALLOW_EVICTION=1) to run anyway"
CLIENT_OVERRIDE = "make the client with allow_eviction=True to write anyway"

Policies = dict[str, str | None]  # node -> its maxmemory-policy (None: it could not be read)


# -- no I/O: what the replies say -----------------------------------------------------------


def from_config(reply: Any) -> str | None:
    """The policy in a ``CONFIG GET maxmemory-policy`` reply (None: not there)."""
    if isinstance(reply, Mapping):
        value = reply.get(POLICY, reply.get(POLICY.encode()))
        return _text(value) or None
    return None


def from_info(reply: Any) -> str | None:
    """The policy in an ``INFO memory`` reply (None: not there)."""
    if isinstance(reply, Mapping):
        return _text(reply.get("maxmemory_policy")) or None
    return None


def evicting(policies: Policies) -> tuple[str, str] | None:
    """The first node whose policy evicts, and that policy; None if none does."""
    for node, policy in policies.items():
        if policy is not None and policy != NOEVICTION:
            return node, policy
    return None


def unknown(policies: Policies) -> list[str]:
    """The nodes whose policy could not be read."""
    return [node for node, policy in policies.items() if policy is None]


def judge(policies: Policies, *, allow: bool, override: str, log: Any) -> None:
    """Raise ``EvictingRedis`` for a node that evicts (unless ``allow``: then a warning);
    one warning for the nodes whose policy could not be read."""
    found = evicting(policies)
    if found is not None:
        node, policy = found
        if not allow:
            raise EvictingRedis(node, policy, override)
        log.warning("redis_evicting", node=node, policy=policy, allowed=True)
    nodes = unknown(policies)
    if nodes:
        log.warning(
            "redis_policy_unknown",
            nodes=nodes,
            reason="CONFIG GET and INFO both refused (ACL?): cannot tell whether Redis evicts",
            advice=f"make sure maxmemory-policy is {NOEVICTION}",
        )


# -- reading it ---------------------------------------------------------------------------


def read_policies(r: Connection) -> Policies:
    """Every primary's policy (one node unless ``r`` is a cluster client)."""
    if isinstance(r, RedisCluster):
        primaries = r.get_primaries()  # type: ignore[no-untyped-call]
        return {node.name: _read_one(r, node) for node in primaries}
    return {_node_name(r): _read_one(r, None)}


def _read_one(r: Connection, node: Any) -> str | None:
    where: dict[str, Any] = {} if node is None else {"target_nodes": node}
    try:
        policy = from_config(r.config_get(POLICY, **where))
        if policy is not None:
            return policy
    except redis.ResponseError:  # NOPERM, or CONFIG renamed away
        pass
    try:
        return from_info(r.info("memory", **where))
    except redis.ResponseError:
        return None


async def read_policies_async(r: Any) -> Policies:
    """``read_policies`` for a ``redis.asyncio`` client (a server or a cluster)."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    if isinstance(r, AsyncRedisCluster):
        await r.initialize()
        return {node.name: await _read_one_async(r, node) for node in r.get_primaries()}
    return {_node_name(r): await _read_one_async(r, None)}


async def _read_one_async(r: Any, node: Any) -> str | None:
    where: dict[str, Any] = {} if node is None else {"target_nodes": node}
    try:
        policy = from_config(await r.config_get(POLICY, **where))
        if policy is not None:
            return policy
    except redis.ResponseError:
        pass
    try:
        return from_info(await r.info("memory", **where))
    except redis.ResponseError:
        return None


def refuse_evicting(r: Connection, *, allow: bool, log: Any) -> Policies:
    """A process's check at its start: read the policy and judge it (``judge``); a Redis
    that cannot be reached is the caller's to wait for (``UNAVAILABLE`` is raised)."""
    policies = read_policies(r)
    judge(policies, allow=allow, override=PROCESS_OVERRIDE, log=log)
    return policies


def warn_evicting(r: Connection, log: Any) -> None:
    """The dashboard's check: a warning only (it shows what is left, and its operator
    actions still run); nothing if Redis cannot be reached now."""
    try:
        policies = read_policies(r)
    except UNAVAILABLE:
        return
    judge(policies, allow=True, override=PROCESS_OVERRIDE, log=log)


class PolicyWatch:
    """A running process reads the policy again every ``interval`` s and says when it
    changes: ``redis_evicting`` (an error) once per change to an evicting policy,
    ``redis_noeviction`` when it is back. Nodes whose policy could not be read at the start
    are not read again (the warning was said once)."""

    def __init__(self, seen: Policies, interval: float, log: Any) -> None:
        self.seen, self.interval, self.log = dict(seen), interval, log
        self.at = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.at >= self.interval and any(
            p is not None for p in self.seen.values()
        )

    def check(self, r: Connection) -> None:
        """Read again if due; say what changed. Redis errors are the caller's."""
        if not self.due():
            return
        self.at = time.monotonic()
        now = read_policies(r)
        for node, policy in now.items():
            before = self.seen.get(node)
            if policy is None or policy == before:
                continue
            self.seen[node] = policy
            if policy == NOEVICTION and before is None:
                continue  # a node new to us (a failover, a new shard): nothing changed
            if policy != NOEVICTION:
                self.log.error(
                    "redis_evicting",
                    node=node,
                    policy=policy,
                    was=before,
                    risk="keys, heartbeats and results can be evicted silently",
                )
            else:
                self.log.info("redis_noeviction", node=node, policy=policy, was=before)


def _node_name(r: Any) -> str:
    """``host:port`` of a single server's client (never its credentials)."""
    pool = r.connection_pool
    service = getattr(pool, "service_name", None)
    if service:  # a sentinel's primary
        return f"the primary of {service}"
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)
