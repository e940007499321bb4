"""The leader lease, held by its own thread: renewal never waits for a pass, however long.

The thread takes ``qw:controller:leader`` when it is free (``lease_acquire.lua``: a new term,
the token ``<id>#<term>``), renews it every third of its TTL while it holds it, and says
``lost`` the moment a renewal finds another token there. ``held()`` is true only while the
last renewal is recent enough that the lease cannot have expired since (by this process's
monotonic clock): a process frozen past its TTL wakes up not holding it, even before the
thread has run. The writes themselves are fenced in Redis (``controller.fence``); this is the
local half, which saves a pass from computing a plan it could not write.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from queueworks.protocol import events
from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text
from queueworks.scripts.bound import Scripts
from queueworks.transport.connection import UNAVAILABLE, Connection

from .tally import Tally

MARGIN = 0.2  # of the TTL: held() turns false this long before the lease could expire


class Lease(threading.Thread):
    def __init__(
        self,
        r: Connection,
        keys: Keys,
        scripts: Scripts,
        holder: str,
        ttl: float,
        log: Any,
        tally: Tally,
    ) -> None:
        super().__init__(name="qw-lease", daemon=True)
        self.r, self.keys, self.scripts, self.holder = r, keys, scripts, holder
        self.ttl, self.log, self.tally = ttl, log, tally
        self.token, self.term = "", 0
        self._until = 0.0  # monotonic: held() is true before this
        self._halt = threading.Event()
        self.won = threading.Event()  # set while this process holds the lease
        # set when the lease went with Redis's data (``check_emptied``); the controller clears it
        self.emptied = threading.Event()
        self._emptied_seen = False
        self._lock = threading.Lock()

    def held(self) -> bool:
        return self.won.is_set() and time.monotonic() < self._until

    def current(self) -> tuple[str, int]:
        """(token, term) of the lease held now (("", 0) if none)."""
        with self._lock:
            return (self.token, self.term) if self.held() else ("", 0)

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self._tick()
            except UNAVAILABLE as exc:
                self.log.warning("lease_redis_unavailable", error=str(exc))
            wait = self.ttl / 3 if self.won.is_set() else min(0.5, self.ttl / 5)
            self._halt.wait(wait)
        self._release()

    def _tick(self) -> None:
        ttl_ms = int(self.ttl * 1000)
        started = time.monotonic()
        self.tally.commands += 1
        if self.won.is_set():
            if self.scripts.lease(self.keys.leader, self.token, "renew", ttl_ms):
                self._until = started + self.ttl * (1 - MARGIN)
                return
            self.log.warning("lease_lost", term=self.term)
            self.check_emptied()
            self.won.clear()
            return
        term, token = self.scripts.lease_acquire(
            self.keys.leader, self.keys.leader_term, self.holder, ttl_ms
        )
        if term:
            with self._lock:
                self.token, self.term = token, term
                self._until = started + self.ttl * (1 - MARGIN)
                self._emptied_seen = False
            self.won.set()
            self.log.info("leadership", leader=True, term=term)
            events.emit(self.r, self.keys, "leader", controller=self.holder, term=term)

    def check_emptied(self) -> None:
        """The lease is gone from under us (the thread's renewal, or a fenced write found
        it so): set ``emptied`` if it went with Redis's data (a restart without persistence,
        a ``FLUSHALL``, a failover to an empty replica). Then the term counter, which only
        ever counts up, is behind the term we held, or at it with another holder (it
        counted up to our term a second time); a lease that expired, or that another
        controller took over, leaves it at our term or past it."""
        with self._lock:
            token, held = self.token, self.term
        if not held or self._emptied_seen:
            return
        self.tally.commands += 2
        pipe = self.r.pipeline(transaction=False)
        pipe.get(self.keys.leader_term)
        pipe.get(self.keys.leader)
        try:
            counter, holder = pipe.execute()
        except UNAVAILABLE:  # (the renewal after the outage looks again)
            return
        term = int(counter or 0)
        if term < held or (term == held and holder is not None and text(holder) != token):
            self._emptied_seen = True  # (said once per lease won)
            self.emptied.set()

    def _release(self) -> None:
        if not self.won.is_set():
            return
        try:
            if self.scripts.lease(self.keys.leader, self.token, "release"):
                self.log.info("lease_released")
        except UNAVAILABLE:
            pass
        self.won.clear()
