"""Keyspace notifications of the keys a worker cares about (its ``assign`` key, its task's
``epoch`` and ``hb:*`` keys), fanned out in process to callbacks.

Notifications are only a trigger, never the truth (pub/sub is fire-and-forget; ``expired``
events can lag by tens of seconds): every callback just wakes the runtime, which re-reads
Redis. After a reconnect every subscription is renewed and every callback fires once, so
anything missed while disconnected is re-read. Where the server will not let us enable
notifications (CONFIG renamed or forbidden), ``enabled`` is False and the runtime's
per-tick polling is the only path, slower but complete.

One server, or the primary that sentinels name: one pub/sub connection (``NodeWatcher``).
After a sentinel failover the connection fails, reconnects to the new primary, enables the
notification flags there (a replica promoted to primary may not have them) and fires every
callback.

Redis Cluster: a node publishes keyspace notifications only to its own subscribers, about
its own keys. So each subscription goes to the primary that owns the key's slot (a task's
keys share one slot, so a worker holds at most two pub/sub connections: the node of its
``assign`` key and the node of its task), and the watcher follows the topology: it re-reads
the slot map every ``TOPOLOGY_INTERVAL`` s and at once when a node connection drops, moves
subscriptions whose slot changed owner (a failover, a resharding) and fires their callbacks,
since anything may have been missed in between. Until it has moved them, the heartbeat's
per-tick reads find every change anyway (within one tick), as in the polling fallback.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from queueworks.transport.connection import Connection
from queueworks.transport.topology import SlotMap, node_client, read_slot_map

# K: keyspace channel; $: string commands (SET/INCR); g: generic (DEL, EXPIRE); x: expired.
NEEDED_FLAGS = "K$gx"
# z: sorted sets (a delayed job added to a queue's ``scheduled``: its leader looks at once).
# Enabled where the server lets us; without it a queue's duties come round as they do.
OPTIONAL_FLAGS = "z"
# t: streams (a job added to a queue's stream: a worker serving many queues reads it).
# Enabled only once a worker serves that many (``enable_stream_notifications``): every XADD
# and XDEL of every job costs the server a notification while it is on. Without it such a
# worker reads every queue it serves (``workers.ready``).
STREAM_FLAG = "t"
TOPOLOGY_INTERVAL = 2.0  # s between slot-map reads in a cluster (and at once on a drop)
MIN_RECHECK = 0.5  # s at least between two slot-map reads

Callback = Callable[[str, str], None]  # (key, event name)


def enable_notifications(r: redis.Redis, log: Any) -> bool:
    """Make sure ``notify-keyspace-events`` has what we need; False if we cannot."""
    try:
        flags = _flags(r)
        has_all = "A" in flags
        missing = [f for f in NEEDED_FLAGS if f not in flags and not (has_all and f in "$gxz")]
        optional = [f for f in OPTIONAL_FLAGS if f not in flags and not has_all]
        if missing:
            r.config_set("notify-keyspace-events", flags + "".join(missing + optional))
        elif optional:
            with contextlib.suppress(redis.ResponseError):
                r.config_set("notify-keyspace-events", flags + "".join(optional))
        return True
    except redis.ResponseError as exc:
        log.warning(
            "keyspace_notifications_unavailable",
            reason=str(exc),
            fallback="polling every heartbeat tick",
        )
        return False


def enable_stream_notifications(r: Any) -> bool:
    """Add flag ``t`` to ``notify-keyspace-events`` (a worker begins to serve many queues);
    whether the server sends stream events now."""
    try:
        flags = _flags(r)
        if _streams_in(flags):
            return True
        r.config_set("notify-keyspace-events", flags + STREAM_FLAG)
    except redis.RedisError:
        return False
    return streams_notified(r)


def streams_notified(r: Any) -> bool:
    """Whether the server sends keyspace notifications of stream commands (flags ``K`` and
    ``t``, or ``A``); False if it will not say."""
    try:
        return _streams_in(_flags(r))
    except redis.RedisError:
        return False


def _flags(r: Any) -> str:
    """The server's ``notify-keyspace-events``, as a string."""
    current = r.config_get("notify-keyspace-events").get("notify-keyspace-events", "")
    return current.decode() if isinstance(current, bytes) else str(current)


def _streams_in(flags: str) -> bool:
    return "K" in flags and ("t" in flags or "A" in flags)


class NodeWatcher:
    """One pub/sub connection to one server; calls back on every notification."""

    def __init__(
        self, r: redis.Redis, log: Any, *, on_drop: Callable[[], None] | None = None
    ) -> None:
        self._r = r
        self._log = log
        self._on_drop = on_drop
        self._db = int(r.connection_pool.connection_kwargs.get("db", 0) or 0)
        self._lock = threading.Lock()
        self._channels: dict[str, Callback] = {}
        self._patterns: dict[str, Callback] = {}
        self._pubsub: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qw-watcher", daemon=True)
        self.enabled = False
        self._enable_again = True
        self.reconnects = 0

    def channel(self, key: str) -> str:
        return f"__keyspace@{self._db}__:{key}"

    @property
    def connected(self) -> bool:
        with self._lock:
            return self._pubsub is not None

    def start(self, *, enable_first: bool = True) -> None:
        """Enable notifications, then listen; where they cannot be enabled, do not listen
        (polling only). ``enable_first=False``: enable them from the listening thread
        instead (the caller holds a lock), and listen anyway."""
        self.enabled = True
        if enable_first:
            try:
                self.enabled = enable_notifications(self._r, self._log)
                self._enable_again = False
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                self._log.warning("watcher_disconnected", error=str(exc), retry_in=0.05)
        if self.enabled:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=3)

    def watch(self, key: str, callback: Callback, *, pattern: bool = False) -> None:
        name = self.channel(key)
        with self._lock:
            (self._patterns if pattern else self._channels)[name] = callback
            ps = self._pubsub
        if ps is not None:
            # on failure the loop reconnects and resubscribes everything
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                (ps.psubscribe if pattern else ps.subscribe)(name)

    def unwatch(self, key: str, *, pattern: bool = False) -> None:
        name = self.channel(key)
        with self._lock:
            (self._patterns if pattern else self._channels).pop(name, None)
            ps = self._pubsub
        if ps is not None:
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                (ps.punsubscribe if pattern else ps.unsubscribe)(name)

    def _subscribe_all(self) -> Any:
        """Subscribe everything and publish the connection in one step under the lock, so a
        ``watch`` that runs meanwhile is either in this snapshot or subscribes itself."""
        ps = self._r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]
        with self._lock:
            channels, patterns = list(self._channels), list(self._patterns)
            # A placeholder keeps the connection in subscribed mode with nothing to watch.
            ps.subscribe(self.channel("__qw_watcher__"), *channels)
            if patterns:
                ps.psubscribe(*patterns)
            self._pubsub = ps
        return ps

    def _fire_all(self) -> None:
        with self._lock:
            callbacks = [*self._channels.items(), *self._patterns.items()]
        for name, cb in callbacks:
            cb(name.split(":", 1)[1], "resubscribed")

    def _run(self) -> None:
        backoff = 0.05
        first = True
        while not self._stop.is_set():
            try:
                if self._enable_again:  # maybe another server now (restarted, promoted)
                    self.enabled = enable_notifications(self._r, self._log)
                self._enable_again = True
                ps = self._subscribe_all()
                if not first:
                    self.reconnects += 1
                    self._log.info("watcher_resubscribed", reconnects=self.reconnects)
                    self._fire_all()
                first, backoff = False, 0.05
                while not self._stop.is_set():
                    msg = ps.get_message(timeout=0.5)
                    if msg is not None:
                        self._dispatch(msg)
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                self._log.warning("watcher_disconnected", error=str(exc), retry_in=backoff)
                with self._lock:
                    self._pubsub = None
                if self._on_drop is not None:
                    self._on_drop()
                first = False
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
        with self._lock:
            ps, self._pubsub = self._pubsub, None
        if ps is not None:
            with contextlib.suppress(Exception):  # closing a dead connection may fail
                ps.close()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        channel = _text(msg.get("channel"))
        event = _text(msg.get("data"))
        with self._lock:
            cb = self._channels.get(channel)
            if cb is None and msg.get("type") == "pmessage":
                cb = self._patterns.get(_text(msg.get("pattern")))
        if cb is not None:
            cb(channel.split(":", 1)[1], event)


class ClusterWatcher:
    """Per-node ``NodeWatcher``s, each subscription on the primary that owns its key, moved
    when the slot map changes (see the module docstring)."""

    def __init__(self, rc: RedisCluster, log: Any, interval: float = TOPOLOGY_INTERVAL) -> None:
        self._rc, self._log, self._interval = rc, log, interval
        self._lock = threading.RLock()
        self._subs: dict[tuple[str, bool], Callback] = {}  # (key, pattern) -> callback
        self._placed: dict[tuple[str, bool], str] = {}  # (key, pattern) -> node
        self._nodes: dict[str, NodeWatcher] = {}
        self._clients: dict[str, redis.Redis] = {}
        self._map = SlotMap(())
        self._stop = threading.Event()
        self._recheck = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="qw-topology", daemon=True)
        self._started = False
        self.moves = 0

    @property
    def enabled(self) -> bool:
        """Notifications enabled on every node we listen on (as far as we know yet)."""
        with self._lock:
            return all(n.enabled for n in self._nodes.values())

    @property
    def reconnects(self) -> int:
        with self._lock:
            return sum(n.reconnects for n in self._nodes.values())

    def start(self) -> None:
        with self._lock:
            self._started = True
        slot_map = self._read()  # None: the follower tries again
        if slot_map is not None:
            self._apply(slot_map)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._recheck.set()
        if self._thread.is_alive():
            self._thread.join(timeout=3)
        with self._lock:
            nodes, self._nodes = list(self._nodes.values()), {}
            clients, self._clients = list(self._clients.values()), {}
        for n in nodes:
            n.stop()
        for c in clients:
            c.close()

    def watch(self, key: str, callback: Callback, *, pattern: bool = False) -> None:
        with self._lock:
            self._subs[(key, pattern)] = callback
            if self._started:
                self._place((key, pattern))

    def unwatch(self, key: str, *, pattern: bool = False) -> None:
        with self._lock:
            self._subs.pop((key, pattern), None)
            node = self._placed.pop((key, pattern), None)
            watcher = self._nodes.get(node) if node else None
        if watcher is not None:
            watcher.unwatch(key, pattern=pattern)

    # -- following the topology -----------------------------------------------------------

    def _follow(self) -> None:
        while not self._stop.is_set():
            self._recheck.wait(self._interval)
            self._recheck.clear()
            if self._stop.is_set():
                return
            slot_map = self._read()
            if slot_map is not None and slot_map != self._map:
                self._apply(slot_map)
            self._stop.wait(MIN_RECHECK)  # a dead node's reconnect attempts ask often

    def _read(self) -> SlotMap | None:
        """The slot map from a node we hold a connection to (not disturbing the cluster
        client's pools), else through the cluster client."""
        with self._lock:  # connected nodes first: a dead one may take a timeout to refuse
            ranked = sorted(self._clients, key=lambda n: not self._nodes[n].connected)
            sources: list[redis.Redis | RedisCluster] = [self._clients[n] for n in ranked]
        sources.append(self._rc)
        error = ""
        for source in sources:
            try:
                return read_slot_map(source)
            except (redis.RedisError, RedisClusterException, OSError) as exc:
                error = str(exc)
        self._log.warning("topology_unreadable", error=error)
        return None

    def _apply(self, slot_map: SlotMap) -> None:
        """Move every subscription to its key's owner now; drop nodes that are not primaries."""
        moved: list[tuple[tuple[str, bool], Callback]] = []
        with self._lock:
            first = not self._map.ranges
            self._map = slot_map
            for sub, cb in self._subs.items():
                before = self._placed.get(sub)
                if self._place(sub) and before is not None:
                    moved.append((sub, cb))
            gone = [n for n in self._nodes if n not in slot_map.primaries]
            stopping = [self._nodes.pop(n) for n in gone]
            closing = [self._clients.pop(n) for n in gone if n in self._clients]
        for watcher in stopping:
            watcher.stop()
        for c in closing:
            c.close()
        if not first:
            self._log.info(
                "topology_changed", primaries=sorted(slot_map.primaries), moved=len(moved)
            )
        self.moves += len(moved)
        for (key, _), cb in moved:
            cb(key, "resubscribed")  # its node changed: anything may have been missed

    def _place(self, sub: tuple[str, bool]) -> bool:
        """Subscribe ``sub`` on its owner (lock held); True if it was placed anew."""
        key, pattern = sub
        owner = self._map.owner_of(key)
        before = self._placed.get(sub)
        if owner is None or owner == before:
            return False
        if before is not None and before in self._nodes:
            self._nodes[before].unwatch(key, pattern=pattern)
        watcher = self._node(owner)
        watcher.watch(key, self._subs[sub], pattern=pattern)
        self._placed[sub] = owner
        return True

    def _node(self, node: str) -> NodeWatcher:
        watcher = self._nodes.get(node)
        if watcher is None:
            client = node_client(self._rc, node)
            watcher = NodeWatcher(client, self._log.bind(node=node), on_drop=self._recheck.set)
            self._clients[node] = client
            self._nodes[node] = watcher
            watcher.start(enable_first=False)  # no network I/O under the lock
        return watcher


class Watcher:
    """The worker's watcher: one ``NodeWatcher`` (one server, or the sentinel-named
    primary), or a ``ClusterWatcher``; same interface either way."""

    def __init__(self, r: Connection, log: Any) -> None:
        self._impl: NodeWatcher | ClusterWatcher = (
            ClusterWatcher(r, log) if isinstance(r, RedisCluster) else NodeWatcher(r, log)
        )

    @property
    def enabled(self) -> bool:
        return self._impl.enabled

    @property
    def reconnects(self) -> int:
        return self._impl.reconnects

    def start(self) -> None:
        self._impl.start()

    def stop(self) -> None:
        self._impl.stop()

    def watch(self, key: str, callback: Callback, *, pattern: bool = False) -> None:
        self._impl.watch(key, callback, pattern=pattern)

    def unwatch(self, key: str, *, pattern: bool = False) -> None:
        self._impl.unwatch(key, pattern=pattern)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
