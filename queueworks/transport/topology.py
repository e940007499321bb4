"""Where keys live in a Redis Cluster: hash slots, the slot map, and one client per node.

Every key of one task shares the task's hash tag ``{T}`` (``queueworks.protocol.keys``), so a task
lives in one slot and one shard; tasks spread over the shards by their ids. A process that
must talk to one node itself (the keyspace-notification watcher: notifications are
published only on the node that owns the key) reads the slot map here and opens its own
client to that node.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.retry import Retry

# What a node client copies from the cluster client's connection options (auth, TLS, timeouts)
_NODE_OPTIONS = ("username", "password", "credential_provider", "client_name", "protocol")
_NODE_PREFIXES = ("ssl", "socket_")


def slot_of(key: str) -> int:
    """The hash slot of ``key`` (of its ``{tag}`` if it has one; a pattern with a tag too)."""
    return int(key_slot(key.encode()))


@dataclass(frozen=True)
class SlotMap:
    """Slot ranges and the primary (``host:port``) that serves each."""

    ranges: tuple[tuple[int, int, str], ...]  # sorted (first slot, last slot, primary)

    def owner(self, slot: int) -> str | None:
        i = bisect.bisect_right(self.ranges, (slot, 1 << 30, "")) - 1
        if i >= 0 and self.ranges[i][0] <= slot <= self.ranges[i][1]:
            return self.ranges[i][2]
        return None

    def owner_of(self, key: str) -> str | None:
        return self.owner(slot_of(key))

    @property
    def primaries(self) -> frozenset[str]:
        return frozenset(node for _, _, node in self.ranges)


def read_slot_map(r: redis.Redis | RedisCluster) -> SlotMap:
    """``CLUSTER SLOTS`` (one small reply: a row per slot range), asked through the cluster
    client (any node) or through a client of one node."""
    rows = []
    if isinstance(r, RedisCluster):
        raw: Any = r.cluster_slots()
        here = r.get_default_node().host  # type: ignore[no-untyped-call]
        for (start, end), info in raw.items():
            host, port = info["primary"]
            rows.append((int(start), int(end), _node_name(host, port, here)))
    else:
        raw = r.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
        here = str(r.connection_pool.connection_kwargs.get("host", ""))
        for row in raw:
            rows.append((int(row[0]), int(row[1]), _node_name(row[2][0], row[2][1], here)))
    return SlotMap(tuple(sorted(rows)))


def _node_name(host: Any, port: Any, here: str) -> str:
    # a lone node that never met another does not know its address: it is the one we asked
    return f"{_text(host) or here}:{int(port)}"


def node_client(rc: RedisCluster, node: str) -> redis.Redis:
    """A client of its own to one node (``host:port``): the cluster client's auth, TLS and
    timeouts, its own connection pool (nothing the cluster client does to its pools —
    reconnecting them after a topology change — touches this one), no retries."""
    host, _, port = node.rpartition(":")
    options = {
        k: v
        for k, v in rc.nodes_manager.connection_kwargs.items()
        if k in _NODE_OPTIONS or k.startswith(_NODE_PREFIXES)
    }
    return redis.Redis(host=host, port=int(port), retry=Retry(NoBackoff(), 0), **options)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def queue_replication_wait(
    pipe: Any,
    r: redis.Redis | RedisCluster | redis.asyncio.Redis | AsyncRedisCluster,
    keys: Sequence[str],
    replicas: int,
    timeout_ms: int,
) -> int:
    """Append ``WAIT replicas timeout_ms`` to ``pipe`` after its writes: once per node that
    holds one of ``keys`` (in a cluster), else once. Returns how many WAITs were added: their
    replies (replicas that acknowledged) are the last ones of ``pipe.execute()``.

    WAIT covers every write the connection made before it, and replication is in order, so
    it also covers what other connections wrote to that node earlier (the subtasks)."""
    if not isinstance(r, RedisCluster | AsyncRedisCluster):  # a pipeline, sync or asyncio
        pipe.execute_command("WAIT", replicas, timeout_ms)
        return 1
    nodes: dict[str, Any] = {}
    for key in keys:
        node: Any = r.get_node_from_key(key)
        nodes[node.name] = node
    for node in nodes.values():
        pipe.execute_command("WAIT", replicas, timeout_ms, target_nodes=node)
    return len(nodes)
