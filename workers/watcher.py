"""One pub/sub connection per process, fanned out in process: keyspace notifications of the
keys a worker cares about (its ``assign`` key, its task's ``epoch`` and ``hb:*`` keys).

Notifications are only a trigger, never the truth (pub/sub is fire-and-forget; ``expired``
events can lag by tens of seconds): every callback just wakes the runtime, which re-reads
Redis. After a reconnect every subscription is renewed and every callback fires once, so
anything missed while disconnected is re-read. Where the server will not let us enable
notifications (CONFIG renamed or forbidden), ``enabled`` is False and the runtime's
per-tick polling is the only path, slower but complete.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

# K: keyspace channel; $: string commands (SET/INCR); g: generic (DEL, EXPIRE); x: expired.
NEEDED_FLAGS = "K$gx"

Callback = Callable[[str, str], None]  # (key, event name)


def enable_notifications(r: redis.Redis, log: Any) -> bool:
    """Make sure ``notify-keyspace-events`` has what we need; False if we cannot."""
    try:
        current = r.config_get("notify-keyspace-events").get("notify-keyspace-events", "")
        flags = current.decode() if isinstance(current, bytes) else str(current)
        has_all = "A" in flags
        missing = [f for f in NEEDED_FLAGS if f not in flags and not (has_all and f in "$gx")]
        if missing:
            r.config_set("notify-keyspace-events", flags + "".join(missing))
        return True
    except redis.ResponseError as exc:
        log.warning(
            "keyspace_notifications_unavailable",
            reason=str(exc),
            fallback="polling every heartbeat tick",
        )
        return False


class Watcher:
    """Subscribes keyspace channels and calls back on every notification."""

    def __init__(self, r: redis.Redis, log: Any) -> None:
        self._r = r
        self._log = log
        self._db = int(r.connection_pool.connection_kwargs.get("db", 0) or 0)
        self._lock = threading.Lock()
        self._channels: dict[str, Callback] = {}
        self._patterns: dict[str, Callback] = {}
        self._pubsub: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qw-watcher", daemon=True)
        self.enabled = False
        self.reconnects = 0

    def channel(self, key: str) -> str:
        return f"__keyspace@{self._db}__:{key}"

    def start(self) -> None:
        self.enabled = enable_notifications(self._r, self._log)
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
        ps = self._r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        with self._lock:
            channels, patterns = list(self._channels), list(self._patterns)
        # A placeholder keeps the connection in subscribed mode even with nothing to watch.
        ps.subscribe(self.channel("__qw_watcher__"), *channels)
        if patterns:
            ps.psubscribe(*patterns)
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
                ps = self._subscribe_all()
                with self._lock:
                    self._pubsub = ps
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
                time.sleep(backoff)
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


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
