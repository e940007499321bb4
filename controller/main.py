"""The controller process: hold the leader lease, wake on the events stream, reconcile.

Replicas: one holds ``qw:controller:leader`` (``controller.lease``: its own thread takes it
when it is free and renews it every third of ``lease_ttl``, however long a pass takes); the
others wait and take over within the TTL when the leader dies. All state lives in Redis, so
a controller that dies loses nothing: a new leader seals the fence and reads everything
(``Reconciler.rebuild``), then keeps what it read in memory and reads again only what the
events name (``XREAD BLOCK`` on ``qw:events``), plus a bounded backstop. A gap in the events
(trimmed while it was behind) means a full read again; so does a Redis outage. Near a
schedule's due time the wait ends on this process's clock, not on the block's timeout
(``controller.scheduler.wake``).

Every write of a pass is fenced (``controller.fence``): a leader frozen past its lease wakes
up and writes nothing.

Fault injection, for tests only: ``QUEUEWORKS_FAULT_STOP_BEFORE_APPLY=N`` makes the leader
SIGSTOP itself right before the writes of its N-th pass that has any (after every local check:
what stops them then is the fence in Redis). Someone else must SIGCONT it.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from typing import Any

from redis.cluster import RedisCluster

from queueworks.logs import get_logger
from queueworks.process import freeze_heap
from queueworks.protocol.keys import Keys
from queueworks.scripts.bound import Scripts
from queueworks.settings import Settings
from queueworks.transport.connection import UNAVAILABLE, connect_settings, redact_url
from queueworks.transport.eviction import PolicyWatch, refuse_evicting
from queueworks.workers.ready import queue_of
from queueworks.workers.watcher import Watcher, enable_stream_notifications

from .demand import Demand
from .emptied import Emptied
from .feed import Feed, Gap
from .fence import Fence, Fenced
from .lease import Lease
from .leftovers import Leftovers
from .reconciler import PassStats, Reconciler
from .scheduler import Scheduler, wake
from .tally import Tally

LEASE_POLL = 0.05  # s between two looks at whether the lease thread won the lease


class Controller:
    def __init__(self, settings: Settings, *, controller_id: str | None = None) -> None:
        self.settings = settings
        self.id = controller_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.keys = Keys(settings.prefix)
        self.log = get_logger(controller_id=self.id)
        self.r = connect_settings(settings)
        self.scripts = Scripts(self.r)
        self.tally = Tally()
        self.fence = Fence(self.r, self.keys, self.scripts, self.tally)
        self.lease = Lease(
            self.r, self.keys, self.scripts, self.id, settings.lease_ttl, self.log, self.tally
        )
        self.feed = Feed(self.r, self.keys, self.id, self.tally)
        self.reconciler = Reconciler(
            self.r,
            self.keys,
            self.fence,
            self.log,
            me=self.id,
            heartbeat_ttl=settings.heartbeat_ttl,
            full_pass_interval=settings.full_pass_interval,
            tally=self.tally,
        )
        self.reconciler.before_apply = self._before_apply
        self.scheduler = Scheduler(
            self.r, self.keys, self.fence, self.log, self.tally, self.lease.held
        )
        self.leftovers = Leftovers(
            self.r, self.keys, self.scripts, self.fence, self.log, self.tally, self.lease.held
        )
        self.emptied = Emptied(self.r, self.keys, self.log, self.tally)
        self.demand = Demand(
            self.r,
            self.keys,
            self.fence,
            self.log,
            self.tally,
            self.lease.held,
            me=self.id,
            target_s=settings.drain_target,
            interval=settings.wanted_interval,
        )
        self.demand.listen = self._listen
        self.watcher: Watcher | None = None
        self._stop = threading.Event()
        self._stats_at = time.monotonic()
        self.term = 0  # the lease term the reconciler's mirror was read under (0 = none)
        self.passes = 0
        self._writing_passes = 0

    @property
    def leader(self) -> bool:
        return self.term != 0

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self.log.info("controller_starting", redis=redact_url(self.settings.redis_url))
        freeze_heap()  # everything above lives as long as the process
        backoff = 0.05
        policy: PolicyWatch | None = None
        while not self._stop.is_set():
            try:
                if policy is None:  # first: refuse an evicting Redis, then take part
                    policy = self._policy()
                    self.lease.start()
                self._say_emptied()
                if self._lead():
                    self._one_pass()
                self._stats()
                policy.check(self.r)
                backoff = 0.05
            except Fenced as exc:
                self.log.warning("writes_fenced", reason=str(exc), term=self.term)
                self._step_down()
            except Gap as exc:
                self.log.warning("events_trimmed", reason=str(exc))
                self._rebuild()
            except UNAVAILABLE as exc:
                self.log.warning("redis_unavailable", error=str(exc), retry_in=backoff)
                self.term = 0  # read everything again once it is back: it may have restarted
                self.scheduler.reset()
                self.demand.reset()
                self.leftovers.reset()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
        self.lease.stop()
        if self.watcher is not None:
            self.watcher.stop()
        if self.lease.is_alive():
            self.lease.join(timeout=5.0)
        self.log.info("controller_stats", **self.tally.snapshot())
        self.r.close()

    def _policy(self) -> PolicyWatch:
        """Redis's maxmemory-policy, refused if it evicts (``queueworks.transport.eviction``), and
        read again now and then."""
        allow, interval = self.settings.allow_eviction, self.settings.policy_check_interval
        return PolicyWatch(refuse_evicting(self.r, allow=allow, log=self.log), interval, self.log)

    def _say_emptied(self, check: bool = False) -> None:
        """If the lease went with Redis's data (``Lease.check_emptied``; ``check``: look now,
        the state is about to be read afresh), say so and what it took."""
        if check:
            self.lease.check_emptied()
        if self.lease.emptied.is_set():
            self.emptied.lost()
            self.lease.emptied.clear()

    def _lead(self) -> bool:
        """True while this controller leads with a mirror read under its current term."""
        token, term = self.lease.current()
        if not term:
            self._step_down()
            self._stop.wait(LEASE_POLL)  # the lease thread tries to win it meanwhile
            return False
        if term != self.term:
            self.fence.arm(token, term)
            self.term = term
            self._rebuild()
        return True

    def _step_down(self) -> None:
        if self.term:
            self.log.info("leadership", leader=False, term=self.term)
        self.term = 0
        self.reconciler.reset()
        self.scheduler.reset()
        self.demand.reset()
        self.leftovers.reset()

    def _rebuild(self) -> None:
        self._say_emptied(check=True)  # (a term starts, events vanished, Redis came back)
        self.feed.start()
        self._log_pass(self.reconciler.rebuild(), full=True)
        self.emptied.read()

    def _one_pass(self) -> None:
        rec = self.reconciler
        now = time.time()
        wait = min(
            self.settings.reconcile_interval,
            self.scheduler.wait(now),
            self.demand.wait(),
            self.leftovers.wait(),
        )
        block, nap = (0, 0.0) if rec.busy() else wake(wait, self.scheduler.due_in(now))
        if nap:
            self._stop.wait(nap)  # a due time is near: on this clock, not on Redis' cron tick
        dirty = self.feed.read(block)
        if dirty.gap:
            raise Gap("qw:events was trimmed past the last event read")
        if dirty or rec.busy() or rec.due():
            self._log_pass(rec.step(dirty))
        self.scheduler.step(dirty.schedules)
        if dirty.schedules:
            self.emptied.read()
        self.leftovers.step(bool(dirty.ended))
        self.demand.step(rec.mirror)

    def _listen(self) -> bool:
        """Keyspace notifications of every queue's stream, priority bands and delayed set,
        for the count of wanted workers (``Demand``); True if they come. Not on a cluster
        (a pattern there would need every node's)."""
        if isinstance(self.r, RedisCluster):
            return False
        self.watcher = Watcher(self.r, self.log)
        self.watcher.start()
        if not self.watcher.enabled or not enable_stream_notifications(self.r):
            return False
        tk = self.keys.task("*")
        for key in (tk.stream, tk.band_pattern, tk.scheduled):
            self.watcher.watch(key, self._on_queue_key, pattern=True)
        return True

    def _on_queue_key(self, key: str, event: str) -> None:
        """A notification (the watcher's thread): a job or a delayed job was added."""
        if event == "resubscribed":
            self.demand.told(None)
            return
        found = queue_of(self.keys, key) if event in ("xadd", "zadd") else None
        if found is not None:
            self.demand.told((found[0],))

    def _log_pass(self, stats: PassStats, full: bool = False) -> None:
        self.passes += 1
        self.tally.events += stats.events
        self.tally.full_passes += full
        self.log.debug("pass", full=full, **vars(stats))

    def _stats(self) -> None:
        if time.monotonic() - self._stats_at >= self.settings.stats_interval:
            self._stats_at = time.monotonic()
            self.log.info("controller_stats", leader=self.leader, **self.tally.snapshot())

    def _before_apply(self, ops: int) -> None:
        """Right before a pass writes: the local half of the fence, and the fault knob."""
        if not self.lease.held():
            raise Fenced("the lease may have expired (by this process's clock)")
        self._writing_passes += 1
        if self._writing_passes == self.settings.fault_stop_before_apply:
            self.log.warning("fault_stop_before_apply", ops=ops, pass_no=self._writing_passes)
            time.sleep(0.05)  # let the log line out
            os.kill(os.getpid(), signal.SIGSTOP)

    def info(self) -> dict[str, Any]:
        return {"id": self.id, "leader": self.leader, "passes": self.passes}
