"""The controller process: hold the leader lease, wake on the events stream, reconcile.

Replicas: one holds ``qw:controller:leader`` (TTL ``lease_ttl``, renewed every pass); the
others poll for it a few times per TTL and take over within the TTL when the leader dies.
All state lives in Redis, so a controller that dies loses nothing.

The leader wakes on every new event (``XREAD BLOCK`` on ``qw:events``: submissions, workers
joining and leaving, members lost, completions, priority changes) and reconciles at once;
a periodic pass every ``reconcile_interval`` is the backstop.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import Any

from controller.reconciler import Reconciler
from queueworks import events
from queueworks.connection import UNAVAILABLE, connect_settings, redact_url
from queueworks.keys import Keys
from queueworks.logs import get_logger
from queueworks.scripts import Scripts
from queueworks.settings import Settings

PASS_GAP = 0.005  # s at least between two event-driven passes: a burst lands in one pass


class Controller:
    def __init__(self, settings: Settings, *, controller_id: str | None = None) -> None:
        self.settings = settings
        self.id = controller_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.keys = Keys(settings.prefix)
        self.log = get_logger(controller_id=self.id)
        self.r = connect_settings(settings)
        self.scripts = Scripts(self.r)
        self.reconciler = Reconciler(self.r, self.keys, self.scripts, self.log)
        self._stop = threading.Event()
        self.leader = False
        self.passes = 0
        self._last_pass = 0.0  # monotonic

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self.log.info("controller_starting", redis=redact_url(self.settings.redis_url))
        backoff = 0.05
        last_event = "$"
        while not self._stop.is_set():
            try:
                if not self._hold_lease():
                    self._stop.wait(min(0.5, self.settings.lease_ttl / 5))
                    continue
                if last_event == "$":
                    last_event = events.latest_id(self.r, self.keys)
                self.reconciler.apply(self.reconciler.read())
                self._last_pass = time.monotonic()
                self.passes += 1
                last_event = self._wait_for_events(last_event)
                backoff = 0.05
            except UNAVAILABLE as exc:
                self.log.warning("redis_unavailable", error=str(exc), retry_in=backoff)
                self.leader = False
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
        self._release()

    def _hold_lease(self) -> bool:
        ttl_ms = int(self.settings.lease_ttl * 1000)
        if self.leader and self.scripts.lease(self.keys.leader, self.id, "renew", ttl_ms):
            return True
        got = bool(self.r.set(self.keys.leader, self.id, nx=True, px=ttl_ms))
        if got != self.leader:
            self.log.info("leadership", leader=got)
            if got:
                events.emit(self.r, self.keys, "leader", controller=self.id)
        self.leader = got
        return got

    def _wait_for_events(self, last_id: str) -> str:
        """Block until something happens (or the periodic pass is due); drain what came.

        The first event after a quiet spell is acted on at once (a lone submission is
        assigned without delay); events that follow a pass within ``PASS_GAP`` wait out
        the gap, so a burst (workers joining, many submissions) lands in one pass."""
        block_ms = max(1, int(self.settings.reconcile_interval * 1000))
        reply: Any = self.r.xread({self.keys.events: last_id}, count=1000, block=block_ms)
        if reply:
            last_id = reply[0][1][-1][0].decode()
            gap = PASS_GAP - (time.monotonic() - self._last_pass)
            if gap > 0:
                time.sleep(gap)
        return last_id

    def _release(self) -> None:
        try:
            if self.leader:
                self.scripts.lease(self.keys.leader, self.id, "release")
                self.log.info("lease_released")
        except UNAVAILABLE:
            pass
        self.r.close()
